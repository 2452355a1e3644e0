"""What an interface (TUI, headless printer, tests) hears from the agent and answers for it.

The loop calls these from its own thread; an interface that draws must hand them over to its UI thread.
The base class is silent and refuses every approval, which is the safe default for a script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

YES, NO, ALWAYS = "yes", "no", "always"

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional marks and overrides
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: Any, lines: bool = True) -> str:
    """What a model, a tool or a repository wrote, safe to draw on the user's terminal. A control character (an
    escape sequence that sets the title, writes the clipboard, moves the cursor or hides text; a carriage return
    that writes over a line; a bidirectional override that shows text in another order than it runs) is written
    as its escape, `\\x1b`. With `lines`, newlines and tabs stay (and CRLF is a newline); without, they are escaped
    too, for one line."""
    s = "" if text is None else str(text)
    if lines:
        s = s.replace("\r\n", "\n")
    return (_UNSAFE if lines else _UNSAFE_LINE).sub(lambda m: repr(m.group())[1:-1], s)


@dataclass
class Answer:
    """An approval answer with what came with it; `approve` may also return the bare YES / NO / ALWAYS."""

    choice: str  # YES | NO | ALWAYS
    message: str = ""  # with NO: what the user wants done instead; it goes back to the model
    rule: str | None = None  # with ALWAYS: the rule to allow (the proposed one, maybe edited); None: proposed
    save: str | None = None  # with ALWAYS: "repo" or "user" settings file, or None for this session only
    reason: str | None = None  # with NO from a non-human (headless): why, instead of "the user declined"


@dataclass
class ApprovalRequest:
    tool: str
    kind: str
    subject: str | None
    arguments: dict[str, Any]
    reason: str
    suggested_rule: str  # the narrowest rule that allows this call: what "always" proposes
    preview: str = ""  # what the call would do: an edit's diff, a command in full


class AgentUI:
    def on_delta(self, kind: str, text: str) -> None:
        """A piece of a streaming response: kind is "content", "reasoning" or "tool_call"."""

    def on_message(self, message: dict[str, Any]) -> None:
        """A message was appended to the conversation (assistant, tool, user)."""

    def on_tool_decision(self, call_id: str, name: str, arguments: Any, decision: str, reason: str) -> None:
        """Whether a call runs: decision is allow | approved | denied | blocked (a hook) | format_error; said for
        every call before it runs or is refused."""

    def on_tool_start(self, name: str, arguments: dict[str, Any]) -> None: ...

    def on_tool_end(self, name: str, result: Any) -> None:
        """`result` is the ToolResult (with `data["diff"]` for edits)."""

    def on_notice(self, text: str) -> None:
        """Something the user should know (sandbox off, compaction, hook warnings)."""

    def on_usage(self, stats: dict[str, Any]) -> None:
        """Totals after each model call: prompt/completion tokens, cost, context use."""

    def approve(self, request: ApprovalRequest) -> str | Answer:
        """YES, NO or ALWAYS (allow the rule for the rest of the session), or an Answer carrying a message for
        the model (NO) or the rule and where to save it (ALWAYS)."""
        return NO
