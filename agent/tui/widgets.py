"""The pieces of the conversation log and the inline approval bar."""

from __future__ import annotations

import json
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Button, Static


class UserLine(Static):
    def __init__(self, text: str):
        super().__init__(Text("> " + text, style="bold cyan"), classes="user")


class Notice(Static):
    def __init__(self, text: str, error: bool = False):
        super().__init__(Text(text, style="red" if error else "dim yellow"), classes="notice")


class Reasoning(Static):
    """The model's thinking, streamed, dimmed."""

    def __init__(self) -> None:
        super().__init__(Text(""), classes="reasoning")
        self.buf = ""

    def add(self, text: str) -> None:
        self.buf += text
        self.update(Text(self.buf[-4000:], style="dim italic"))


def summarize_args(arguments: dict[str, Any]) -> str:
    if "command" in arguments:
        return str(arguments["command"])
    if "path" in arguments:
        return str(arguments["path"])
    return json.dumps(arguments)[:120]


class ToolCall(Static):
    def __init__(self, name: str, arguments: dict[str, Any]):
        super().__init__(Text(f"● {name}({summarize_args(arguments)[:200]})", style="bold magenta"), classes="tool")


class ToolOutput(Static):
    """A tool's result: the first lines of its output, or the diff of an edit."""

    def __init__(self, name: str, result: Any):
        diff = (result.data or {}).get("diff")
        if diff:
            body: Any = Syntax(diff[:20000], "diff", theme="ansi_dark", word_wrap=True)
        else:
            lines = result.output.splitlines()
            shown = "\n".join(lines[:12]) + (f"\n… {len(lines) - 12} more lines" if len(lines) > 12 else "")
            body = Text(shown, style="red" if result.is_error else "")
        super().__init__(body, classes="tool-output")


class ApprovalBar(Horizontal, can_focus=True):
    """Shown while the agent waits for a yes / no / always answer."""

    BINDINGS = [
        Binding("y", "answer('yes')", "yes"),
        Binding("n", "answer('no')", "no"),
        Binding("a", "answer('always')", "always"),
    ]

    class Answered(Message):
        def __init__(self, answer: str):
            super().__init__()
            self.answer = answer

    def compose(self) -> ComposeResult:
        yield Static("", id="approval-text")
        yield Button("Yes (y)", id="yes", variant="success")
        yield Button("Always (a)", id="always")
        yield Button("No (n)", id="no", variant="error")

    def ask(self, text: str) -> None:
        self.query_one("#approval-text", Static).update(Text(text, style="bold"))
        self.display = True
        self.focus()

    def action_answer(self, answer: str) -> None:
        self.display = False
        self.post_message(self.Answered(answer))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_answer(event.button.id or "no")
