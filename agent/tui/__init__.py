"""The Textual TUI of `glm5 code`.

    app.py      CodeApp: the conversation log, the prompt, the status line; runs the agent in a worker thread
    bridge.py   TUIBridge: the AgentUI the loop talks to, handing every event to the UI thread
    widgets.py  the pieces of the log (messages, tool calls, diffs) and the inline approval bar

A task: Input submitted -> slash command / `!cmd` / task (with @file mentions expanded) -> worker thread runs
`agent.run` -> the bridge streams deltas, tool calls, diffs and approvals back -> Esc sets the interrupt event.
"""
