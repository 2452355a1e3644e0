"""The Textual TUI of `glm5 code`.

    app.py      CodeApp: the conversation log, the prompt, the status line (live token estimate while a reply
                streams); runs the agent in a worker thread; Esc / Ctrl-C interrupt, a second Ctrl-C quits
    bridge.py   TUIBridge: the AgentUI the loop talks to, handing every event to the UI thread
    widgets.py  the pieces of the log (messages, tool calls, diffs), the log itself (follows new output unless
                the user scrolled up; a marker then, End jumps back) and the approval bar (diff / command shown;
                no + a message for the model; always + the narrowest rule, editable, and where to save it)
    terminal_pane.py  TerminalPane: the live screens of the agent's terminal sessions (Ctrl+T cycles / closes)

A task: Input submitted -> slash command / `!cmd` / task (with @file mentions expanded) -> worker thread runs
`agent.run` -> the bridge streams deltas, tool calls, diffs and approvals back -> Esc sets the interrupt event.
"""
