"""CodeApp: the interactive `glm5 code`.

Streamed markdown answers (appended, never re-rendered whole), tool calls and diffs as they happen, approvals
inline (the edit's diff or the whole command first; "no" can tell the model what to do instead; "always" proposes
the narrowest rule, editable, and saves it where the user says), `@file` mentions, `!cmd`, slash commands, and a
status line with model, mode, tokens (moving while a reply streams), cost and context use. Ctrl+T opens the pane
of the agent's terminal sessions (agent/tui/terminal_pane.py), their live screens.

The log follows new output unless the user scrolled up; then a marker says there is more below, and End (or
PageDown to the bottom) follows again. Esc or Ctrl-C interrupts the running turn; a second Ctrl-C within
QUIT_WINDOW_S, or one while idle with an empty prompt, quits. The agent runs in a worker thread; the UI never
blocks on it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Markdown, Static

from agent import commands
from agent.builder import build_session
from agent.client import APIError
from agent.settings import MODES
from agent.tui.bridge import TUIBridge
from agent.tui.terminal_pane import TerminalPane
from agent.tui.widgets import (
    ApprovalBar,
    ConversationLog,
    NewOutputMarker,
    Notice,
    Reasoning,
    ToolCall,
    ToolOutput,
    UserLine,
)
from agent.ui import ALWAYS, NO, Answer, ApprovalRequest, terminal_safe

QUIT_WINDOW_S = 2.0  # a second Ctrl-C within this many seconds quits
STATUS_EVERY_S = 0.1  # the status line's live token estimate is redrawn at most this often while streaming

CSS = """
#log { height: 1fr; padding: 0 1; }
#approval { height: auto; display: none; padding: 0 1; background: $boost; }
#approval-text { width: 1fr; padding: 1 0 0 0; }
#approval-preview-box { height: auto; max-height: 16; }
#approval-buttons { height: auto; }
#approval-input { margin: 0 0 1 0; }
#new-output { height: 1; display: none; padding: 0 1; }
#status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
.user { margin-top: 1; }
.tool { margin-top: 1; }
.tool-output { padding-left: 2; color: $text-muted; }
.reasoning { padding-left: 2; }
Markdown { margin: 0; padding: 0; }
"""


class CodeApp(App):
    CSS = CSS
    TITLE = "glm5 code"
    BINDINGS = [
        Binding("escape", "interrupt", "interrupt", priority=True),
        Binding("ctrl+c", "ctrl_c", "interrupt / quit", priority=True),
        Binding("ctrl+d", "quit", "quit", priority=True),
        Binding("shift+tab", "cycle_mode", "mode", priority=True),
        Binding("ctrl+t", "terminal", "terminal", priority=True),  # the agent's terminal sessions, live
        Binding("end", "end", "latest", priority=True),  # priority: the prompt's own End moves its cursor
        Binding("pageup", "page('up')", "scroll up", show=False),
        Binding("pagedown", "page('down')", "scroll down", show=False),
    ]

    def __init__(self, session_factory: Callable[[Any], Any]):
        super().__init__()
        self.session_factory = session_factory
        self.bridge = TUIBridge(self)
        self.session: Any = None
        self.busy = False
        self.ui_thread = threading.get_ident()
        self._md: Markdown | None = None
        self._stream: Any = None
        self._reasoning: Reasoning | None = None
        self._streamed_chars = 0  # of the reply streaming now: the status line's live token estimate
        self._drawn_chars = 0  # what the status line last showed of it
        self._last_ctrl_c = float("-inf")
        self._status_at = float("-inf")
        self.exit_code = 0

    # -- layout ------------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield ConversationLog(id="log")
        yield NewOutputMarker()
        yield TerminalPane(self._terminals, id="terminal")
        yield ApprovalBar(id="approval")
        yield Input(placeholder="Ask for a change. /help for commands, !cmd runs a command, @path attaches a file",
                    id="prompt")  # fmt: skip
        yield Static("", id="status")

    def on_mount(self) -> None:
        self.ui_thread = threading.get_ident()
        self.session = self.session_factory(self.bridge)
        s = self.session
        self.notice(
            f"glm5 code · {s.settings.provider.model} at {s.settings.provider.base_url} · mode {s.settings.mode}"
            f" · session {s.id} · trajectory {s.path}"
        )
        for w in self.session.warnings:
            self.notice(w)
        if self.session.resumed:
            self.notice(f"resumed session {self.session.id} ({len(self.session.agent.messages)} messages)")
        self.refresh_status()
        # the live token estimate is redrawn on a clock too, not only when a delta arrives past the interval:
        # the count of a burst's last deltas is shown without waiting for the next one
        self.set_interval(STATUS_EVERY_S * 3, self._tick_status)
        self.query_one("#prompt", Input).focus()

    def _terminals(self) -> Any:
        env = getattr(getattr(self.session, "agent", None), "env", None)
        return getattr(env, "_terminals", None)

    def action_terminal(self) -> None:
        self.query_one("#terminal", TerminalPane).cycle()

    @property
    def log_view(self) -> ConversationLog:
        return self.query_one("#log", ConversationLog)

    def add(self, widget: Any) -> Any:
        mounted = self.log_view.mount(widget)  # the anchored log keeps itself at the bottom while following
        self.new_output()
        return mounted

    def new_output(self) -> None:
        if not self.log_view.following:
            self.query_one("#new-output").display = True

    def on_conversation_log_follow_changed(self, event: ConversationLog.FollowChanged) -> None:
        if event.following:
            self.query_one("#new-output").display = False

    def action_end(self) -> None:
        """End: back to the latest output (and following it); with the log already there, the prompt's End."""
        if not self.log_view.following or self.log_view.scroll_y < self.log_view.max_scroll_y:
            self.log_view.jump_to_latest()
            self.query_one("#new-output").display = False
        elif isinstance(self.focused, Input):
            self.focused.action_end()

    def action_page(self, direction: str) -> None:
        log = self.log_view
        if direction == "up":
            log.scroll_page_up(animate=False)  # a user scroll: releases the anchor
        else:
            log.scroll_page_down(animate=False)

    def notice(self, text: str, error: bool = False) -> None:
        self.add(Notice(text, error))

    def refresh_status(self) -> None:
        if self.session is None:
            return
        a = self.session.agent
        state = "working… (Esc / Ctrl-C interrupts)" if self.busy else "ready"
        live = f" · ↓ ~{(self._streamed_chars + 3) // 4:,} tokens" if self._streamed_chars else ""
        line = f"{a.model.config.model} · {a.permissions.mode}{live} · {commands.cost_line(a)} · {state}"
        self._status_at, self._drawn_chars = time.monotonic(), self._streamed_chars
        self.query_one("#status", Static).update(Text(line))

    # -- input -------------------------------------------------------------------------------------------------

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        event.input.value = ""
        if not text:
            return
        if self.busy:
            self.notice("the agent is working; Esc interrupts it")
            return
        self.add(UserLine(text))
        if text.startswith("/"):
            res = commands.handle(self.session, text)
            if res.exit:
                self.exit(0)
                return
            if res.diff:
                self.add(Static(Syntax(terminal_safe(res.text[:100_000]), "diff", theme="ansi_dark", word_wrap=True)))
            else:
                self.notice(res.text, error=res.error)
            self.refresh_status()
        elif text.startswith("!"):
            self.start(lambda: self._shell(text[1:].strip()))
        else:
            task = commands.expand_mentions(self.session.agent, text)
            self.start(lambda: self._turn(task))

    def start(self, fn: Callable[[], None]) -> None:
        self.busy = True
        self.refresh_status()
        self.run_worker(fn, thread=True, exclusive=True, group="agent")

    def _shell(self, command: str) -> None:
        try:
            out = commands.run_shell(self.session.agent, command)
            self.call_from_thread(self.add, Static(Text(terminal_safe(out))))
        finally:
            self.call_from_thread(self._done)

    def _turn(self, task: str) -> None:
        try:
            res = self.session.agent.run(task)
            if res.exit_status != "submitted":
                self.call_from_thread(self.notice, f"turn ended: {res.final or res.exit_status}")
        except APIError as e:
            self.call_from_thread(self.notice, f"model endpoint error: {e}", True)
        except Exception as e:  # noqa: BLE001 - show it, keep the session alive
            self.call_from_thread(self.notice, f"error: {type(e).__name__}: {e}", True)
        finally:
            self.call_from_thread(self._done)

    def _tick_status(self) -> None:
        if self._streamed_chars != self._drawn_chars:  # deltas arrived that no redraw showed
            at = self._status_at
            self.refresh_status()
            self._status_at = at  # the clock's redraw does not hold back the next delta's

    def _done(self) -> None:
        self.busy = False
        self._streamed_chars = 0  # an interrupted reply never reached end_stream: no stale estimate stays
        self.refresh_status()
        self.query_one("#prompt", Input).focus()

    def action_cycle_mode(self) -> None:
        """Shift+Tab: ask -> accept-edits -> plan -> auto -> ask."""
        perms = self.session.agent.permissions
        perms.mode = MODES[(MODES.index(perms.mode) + 1) % len(MODES)]
        self.refresh_status()

    def agent_interrupted(self) -> bool:
        return self.session is not None and self.session.agent.interrupt.is_set()

    def action_interrupt(self) -> None:
        if self.busy and self.session is not None:
            self.session.agent.interrupt.set()
            approval = self.query_one("#approval", ApprovalBar)
            if approval.display:
                approval.finish(Answer(NO))
            self.notice("interrupting… (Ctrl-C again quits)")

    def action_ctrl_c(self) -> None:
        """Ctrl-C: interrupt the running turn; a second one soon after quits. Idle: clear the prompt, or quit."""
        now = time.monotonic()
        again = now - self._last_ctrl_c < QUIT_WINDOW_S
        self._last_ctrl_c = now
        prompt = self.query_one("#prompt", Input)
        if again:
            self.exit(0)
        elif self.busy:
            self.action_interrupt()
        elif prompt.value:
            prompt.value = ""
            self.notice("prompt cleared (Ctrl-C again quits)")
        else:
            self.exit(0)

    # -- agent events (UI thread) ------------------------------------------------------------------------------

    async def stream_delta(self, kind: str, text: str) -> None:
        self._streamed_chars += len(text)
        if time.monotonic() - self._status_at >= STATUS_EVERY_S:  # not once per token: it redraws the line
            self.refresh_status()
        if kind == "reasoning":
            if self._reasoning is None:
                self._reasoning = Reasoning()
                self.add(self._reasoning)
            self._reasoning.add(text)
        elif kind == "content":
            if self._stream is None:
                self._md = Markdown()
                await self.log_view.mount(self._md)  # mounted before the first write, or that write is lost
                self._stream = Markdown.get_stream(self._md)
            await self._stream.write(terminal_safe(text))  # batched appends: no full re-render per token
            self.new_output()
        else:
            self.new_output()

    async def end_stream(self, message: dict[str, Any]) -> None:
        if self._stream is not None:
            await self._stream.stop()
        elif message.get("content"):  # not streamed (the server ignored stream=True)
            self.add(Markdown(terminal_safe(message["content"])))
        self._md = self._reasoning = self._stream = None
        self._streamed_chars = 0  # the call's usage has arrived (on_usage) or is about to

    def show_tool(self, name: str, arguments: dict[str, Any]) -> None:
        self.add(ToolCall(name, arguments))

    def show_tool_output(self, name: str, result: Any) -> None:
        self.add(ToolOutput(name, result))

    def show_refused(self, name: str, arguments: Any, reason: str, show_call: bool = True) -> None:
        if show_call:
            self.add(ToolCall(name, arguments))
        self.notice(f"refused: {reason}", error=True)

    def ask_approval(self, req: ApprovalRequest) -> None:
        self.add(ToolCall(req.tool, req.arguments))
        self.query_one("#approval", ApprovalBar).ask(req)

    def on_approval_bar_answered(self, event: ApprovalBar.Answered) -> None:
        a = event.answer
        if a.choice == NO:
            self.notice(f"no: told the model {a.message!r}" if a.message else "no")
        elif a.choice == ALWAYS:
            self.notice(f"always: {a.rule} ({'this session' if not a.save else a.save + ' settings'})")
        else:
            self.notice(a.choice)
        self.bridge.answer(a)
        self.query_one("#prompt", Input).focus()

    def on_unmount(self) -> None:
        if self.session is not None:
            a = self.session.agent
            a.interrupt.set()
            try:
                a.finish("user_exit")
            finally:
                self.session.close()


def run_tui(cwd: Path, settings: Any, resume: str | None = None, continue_latest: bool = False) -> int:
    app = CodeApp(lambda ui: session)
    try:  # built before the screen opens, so a bad --resume is a plain error message
        session = build_session(cwd, settings, app.bridge, resume=resume, continue_latest=continue_latest)
    except (FileNotFoundError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    app.run()
    return app.exit_code
