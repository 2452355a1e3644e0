"""The coding agent: model client, loop, tools, permissions, sessions, hooks, TUI, benchmark runner."""
