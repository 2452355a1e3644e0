"""The terminal pane: the live screen of the agent's terminal sessions (agent/terminal.py), beside the log.

Ctrl+T opens it on the session the agent used last, then shows the next open session, then closes. It redraws a
few times a second from the session's emulated screen (what the model is shown when it reads), so the user
watches a REPL, a debugger or a server's log as the agent drives it. What the program printed is drawn with its
control characters escaped (terminal_safe), as everything else a program or the model writes.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from agent.ui import terminal_safe

REFRESH_S = 0.25


class TerminalPane(Static):
    """Hidden until opened; `shown` is the session name it follows (None: the one used last)."""

    DEFAULT_CSS = """
    TerminalPane { display: none; height: auto; max-height: 50%; border: round $accent; padding: 0 1; }
    """

    def __init__(self, terminals: Any, **kw: Any):
        """`terminals`: a callable returning the session's Terminals, or None before the first terminal_open."""
        super().__init__("", **kw)
        self.terminals = terminals
        self.shown: str | None = None

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self.redraw)

    def live(self) -> list[Any]:
        terms = self.terminals()
        if terms is None:
            return []
        return sorted((s for s in terms.sessions.values()), key=lambda s: s.last_used, reverse=True)

    def cycle(self) -> None:
        """Closed -> the last used session -> each other session -> closed."""
        names = [s.name for s in self.live()]
        if not self.display:
            self.shown, self.display = (names[0] if names else None), True
        else:
            rest = [n for n in names if n != self.shown]
            order = names if self.shown not in names else names[names.index(self.shown) + 1 :]
            nxt = next(iter(order), None) if rest else None
            if nxt is None:
                self.display = False
            self.shown = nxt
        self.redraw()

    def redraw(self) -> None:
        if not self.display:
            return
        sessions = {s.name: s for s in self.live()}
        s = sessions.get(self.shown or "") or next(iter(sessions.values()), None)
        if s is None:
            self.border_title = "terminal"
            self.update(Text("(no terminal session: the agent opens one with terminal_open)"))
            return
        with s.lock:
            rows = [s.screen.row_text(y) for y in range(s.screen.lines)]
        while rows and not rows[-1]:
            rows.pop()
        state = "running" if s.alive else "ended"
        others = [n for n in sessions if n != s.name]
        self.border_title = f"terminal {s.name} ({state})" + (f" · also {', '.join(others)}" if others else "")
        self.update(Text(terminal_safe("\n".join(rows)) or "(empty screen)"))
