"""What an interface (TUI, headless printer, tests) hears from the agent and answers for it.

The loop calls these from its own thread; an interface that draws must hand them over to its UI thread.
The base class is silent and refuses every approval, which is the safe default for a script.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

YES, NO, ALWAYS = "yes", "no", "always"


@dataclass
class ApprovalRequest:
    tool: str
    kind: str
    subject: str | None
    arguments: dict[str, Any]
    reason: str
    suggested_rule: str


class AgentUI:
    def on_delta(self, kind: str, text: str) -> None:
        """A piece of a streaming response: kind is "content", "reasoning" or "tool_call"."""

    def on_message(self, message: dict[str, Any]) -> None:
        """A message was appended to the conversation (assistant, tool, user)."""

    def on_tool_start(self, name: str, arguments: dict[str, Any]) -> None: ...

    def on_tool_end(self, name: str, result: Any) -> None:
        """`result` is the ToolResult (with `data["diff"]` for edits)."""

    def on_notice(self, text: str) -> None:
        """Something the user should know (sandbox off, compaction, hook warnings)."""

    def on_usage(self, stats: dict[str, Any]) -> None:
        """Totals after each model call: prompt/completion tokens, cost, context use."""

    def approve(self, request: ApprovalRequest) -> str:
        """YES, NO or ALWAYS (allow this rule for the rest of the session)."""
        return NO
