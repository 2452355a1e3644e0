"""The pieces of the conversation log, the log itself (following new output), and the inline approval bar."""

from __future__ import annotations

import json
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Input, Static

from agent.tools.base import EDIT, EXECUTE
from agent.ui import ALWAYS, NO, YES, Answer, ApprovalRequest, terminal_safe


class UserLine(Static):
    def __init__(self, text: str):
        super().__init__(Text("> " + terminal_safe(text), style="bold cyan"), classes="user")


class Notice(Static):
    def __init__(self, text: str, error: bool = False):
        super().__init__(Text(terminal_safe(text), style="red" if error else "dim yellow"), classes="notice")


class Reasoning(Static):
    """The model's thinking, streamed, dimmed."""

    def __init__(self) -> None:
        super().__init__(Text(""), classes="reasoning")
        self.buf = ""

    def add(self, text: str) -> None:
        self.buf += terminal_safe(text)
        self.update(Text(self.buf[-4000:], style="dim italic"))


def summarize_args(arguments: Any) -> str:
    """A call's arguments on one line, as the model wrote them but with escape codes escaped."""
    if not isinstance(arguments, dict):  # a malformed call's raw arguments
        return terminal_safe(arguments or "", lines=False)[:120]
    if "command" in arguments:
        return terminal_safe(arguments["command"])
    if "path" in arguments:
        return terminal_safe(arguments["path"], lines=False)
    return json.dumps(arguments)[:120]  # json escapes every control character


class ToolCall(Static):
    def __init__(self, name: str, arguments: Any):
        shown = f"● {terminal_safe(name, lines=False)}({summarize_args(arguments)[:200]})"
        super().__init__(Text(shown, style="bold magenta"), classes="tool")


class ToolOutput(Static):
    """A tool's result: the first lines of its output, or the diff of an edit."""

    def __init__(self, name: str, result: Any):
        diff = (result.data or {}).get("diff")
        if diff:
            body: Any = Syntax(terminal_safe(diff[:20000]), "diff", theme="ansi_dark", word_wrap=True)
        else:
            lines = terminal_safe(result.output).splitlines()
            shown = "\n".join(lines[:12]) + (f"\n… {len(lines) - 12} more lines" if len(lines) > 12 else "")
            body = Text(shown, style="red" if result.is_error else "")
        super().__init__(body, classes="tool-output")


class ConversationLog(VerticalScroll):
    """The log. Anchored (Textual's anchor): new output keeps the view at the bottom until the user scrolls up;
    back at the bottom, it follows again. `following` says which; the app shows a marker while it is not."""

    class FollowChanged(Message):
        def __init__(self, following: bool):
            super().__init__()
            self.following = following

    def on_mount(self) -> None:
        self.anchor()
        self._was_following = True

    @property
    def following(self) -> bool:
        # Textual keeps "the user scrolled away" in a private flag; anchor() and release_anchor() are its API
        return self.is_anchored and not getattr(self, "_anchor_released", False)

    def jump_to_latest(self) -> None:
        self.anchor()  # re-anchors and scrolls to the end

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.following != getattr(self, "_was_following", True):
            self._was_following = self.following
            self.post_message(self.FollowChanged(self.following))


class NewOutputMarker(Static):
    """Shown under the log while the user has scrolled up and new output arrived below."""

    def __init__(self) -> None:
        super().__init__(Text("▼ new output below: End jumps to the latest", style="bold reverse"), id="new-output")


class ApprovalBar(Vertical, can_focus=True):
    """Shown while the agent waits for an answer. It shows what the call would do (the diff of an edit, the
    whole command), then:
        y  yes
        n  no: an optional message for the model (what to do instead), Enter sends it
        a  always: the proposed narrowest rule, editable, Enter; then where it holds: s this session,
           r the repository's settings, u the user's settings
    """

    BINDINGS = [
        Binding("y", "answer('yes')", "yes"),
        Binding("n", "answer('no')", "no"),
        Binding("a", "answer('always')", "always"),
        Binding("s", "scope('session')", "this session", show=False),
        Binding("r", "scope('repo')", "repository", show=False),
        Binding("u", "scope('user')", "user", show=False),
    ]

    class Answered(Message):
        def __init__(self, answer: Answer):
            super().__init__()
            self.answer = answer

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.stage = "idle"  # choose -> (message | rule -> scope) -> idle
        self.request: ApprovalRequest | None = None
        self.rule = ""
        self.preview_text = ""  # what the preview shows (for tests and screen readers)

    def compose(self) -> ComposeResult:
        yield Static("", id="approval-text")
        with VerticalScroll(id="approval-preview-box"):
            yield Static("", id="approval-preview")
        with Horizontal(id="approval-buttons"):
            yield Button("Yes (y)", id="yes", variant="success")
            yield Button("Always (a)", id="always")
            yield Button("No (n)", id="no", variant="error")
        yield Input(id="approval-input")

    def on_mount(self) -> None:
        self.query_one("#approval-input", Input).display = False

    def _title(self, text: str) -> None:
        self.query_one("#approval-text", Static).update(Text(terminal_safe(text), style="bold"))

    def ask(self, req: ApprovalRequest) -> None:
        self.request, self.stage = req, "choose"
        self._title(f"Allow {req.tool}?  ({req.reason})   y yes · n no (+ a message) · a always ({req.suggested_rule})")
        lexer = "diff" if req.kind == EDIT else ("bash" if req.kind == EXECUTE else "json")
        preview = self.preview_text = terminal_safe(req.preview) or summarize_args(req.arguments)
        self.query_one("#approval-preview", Static).update(Syntax(preview, lexer, theme="ansi_dark", word_wrap=True))
        self.query_one("#approval-buttons").display = True
        self.query_one("#approval-input", Input).display = False
        self.display = True
        self.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "answer":
            return self.stage == "choose"
        if action == "scope":
            return self.stage == "scope"
        return True

    def _input(self, placeholder: str, value: str = "") -> None:
        self.query_one("#approval-buttons").display = False
        box = self.query_one("#approval-input", Input)
        box.placeholder, box.value, box.display = placeholder, value, True
        box.focus()

    def action_answer(self, choice: str) -> None:
        if choice == YES:
            self.finish(Answer(YES))
        elif choice == NO:
            self.stage = "message"
            self._title("No. What should the model do instead? (Enter sends; empty just refuses)")
            self._input("e.g. use make clean instead")
        elif choice == ALWAYS:
            self.stage = "rule"
            self._title("Always allow this rule (edit it if you like; Enter confirms):")
            # the proposed rule is the model's text: drawn escaped (an Input draws its value raw), and taken as
            # proposed when it comes back unedited
            self._input("bash(command prefix:*)", terminal_safe(self._suggested(), lines=False))

    def _suggested(self) -> str:
        return self.request.suggested_rule if self.request else ""

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.stage == "message":
            self.finish(Answer(NO, message=event.value.strip()))
        elif self.stage == "rule":
            typed, suggested = event.value.strip(), self._suggested()
            self.rule = suggested if typed in ("", terminal_safe(suggested, lines=False).strip()) else typed
            self.stage = "scope"
            self.query_one("#approval-input", Input).display = False
            self._title(f"Allow {self.rule}: s this session only · r this repository (.glm5/settings.local.toml) · "
                        "u all your repositories (user settings)")  # fmt: skip
            self.focus()

    def action_scope(self, scope: str) -> None:
        self.finish(Answer(ALWAYS, rule=self.rule, save=None if scope == "session" else scope))

    def finish(self, answer: Answer) -> None:
        self.stage, self.display = "idle", False
        self.post_message(self.Answered(answer))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_answer(event.button.id or NO)
