"""The AgentUI of the TUI: the loop runs in a worker thread; every event is handed to the UI thread."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

from agent.ui import NO, AgentUI, Answer, ApprovalRequest


class TUIBridge(AgentUI):
    def __init__(self, app: Any):
        self.app = app
        self._answer: str | Answer = NO
        self._answered = threading.Event()
        self._asked = False  # the call now being decided was put to the user
        self._asked_call = ""  # the last call put to the user, on screen with the approval bar

    def _call(self, fn, *args) -> None:
        if threading.get_ident() == self.app.ui_thread:
            result = fn(*args)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)
        else:  # blocks until the UI thread has run it, so events arrive in order
            self.app.call_from_thread(fn, *args)

    def on_delta(self, kind: str, text: str) -> None:
        self._call(self.app.stream_delta, kind, text)

    def on_message(self, message: dict[str, Any]) -> None:
        if message.get("role") == "assistant":
            self._call(self.app.end_stream, message)

    def on_tool_decision(self, call_id: str, name: str, arguments: Any, decision: str, reason: str) -> None:
        # A call refused without asking (a malformed call, a deny rule, a hook) would otherwise not show at all.
        # One put to the user is on screen already: their no is shown with it, and a hook that blocks it after
        # their yes (a second decision for the same call) adds only why.
        asked, self._asked = self._asked, False
        if asked:
            self._asked_call = call_id
        if decision in ("denied", "blocked", "format_error") and not (asked and decision == "denied"):
            self._call(self.app.show_refused, name, arguments, reason, call_id != self._asked_call)

    def on_tool_start(self, name: str, arguments: dict[str, Any]) -> None:
        self._call(self.app.show_tool, name, arguments)

    def on_tool_end(self, name: str, result: Any) -> None:
        self._call(self.app.show_tool_output, name, result)

    def on_notice(self, text: str) -> None:
        self._call(self.app.notice, text)

    def on_usage(self, stats: dict[str, Any]) -> None:
        self._call(self.app.refresh_status)

    def approve(self, request: ApprovalRequest) -> str | Answer:
        self._asked = True
        self._answered.clear()
        self._call(self.app.ask_approval, request)
        while not self._answered.wait(0.1):
            if self.app.agent_interrupted():
                return NO
        return self._answer

    def answer(self, answer: str | Answer) -> None:
        self._answer = answer
        self._answered.set()
