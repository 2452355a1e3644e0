"""The loop's control flow: the exceptions that end a step and the exit statuses a turn ends with.

As in mini-swe-agent, a step ends normally by raising: `Submitted` (the model answered without tool calls),
`LimitsExceeded`, `FormatError` (told to the model, the loop goes on), `Interrupted` (Esc / Ctrl-C).
Headless maps the exit statuses to exit codes.
"""

from __future__ import annotations

SUBMITTED, LIMITS, INTERRUPTED, FORMAT, ERROR, BLOCKED = (
    "submitted",
    "limits_exceeded",
    "interrupted",
    "format_error",
    "error",
    "blocked",
)


class InterruptAgentFlow(Exception):
    """Ends the current step; the subclass says why."""


class Submitted(InterruptAgentFlow):
    """The model answered without tool calls: its turn is done."""


class LimitsExceeded(InterruptAgentFlow):
    """Steps, tokens, cost or wall time ran out."""


class FormatError(InterruptAgentFlow):
    """The model's tool call cannot be parsed or names no tool; the message tells the model how to fix it."""


class RepeatedFormatError(LimitsExceeded):
    """Too many format errors in a row."""


class Interrupted(InterruptAgentFlow):
    """The user pressed Esc / Ctrl+C."""
