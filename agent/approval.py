"""Approval: may one tool call run? The permission rules decide, and where they say "ask" the user answers.

    decide(agent, name, tool, subject, args) -> Verdict
      permissions.check -> allow | deny, or ask -> ui.approve(ApprovalRequest) -> yes | no | always
      "always" adds the proposed rule for the rest of the session.

The verdict's `decision` is what the trajectory records (allow | approved | denied) and `reason` what the model
is told when the call is refused. Knows nothing of running the tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.permissions import ALLOW, ASK, DENY, suggest_rule
from agent.ui import ALWAYS, YES, ApprovalRequest

if TYPE_CHECKING:
    from agent.loop import Agent
    from agent.tools.base import Tool

ALLOWED, APPROVED, DENIED = "allow", "approved", "denied"


@dataclass(frozen=True)
class Verdict:
    decision: str  # ALLOWED | APPROVED | DENIED
    reason: str

    @property
    def runs(self) -> bool:
        return self.decision != DENIED


def decide(agent: Agent, name: str, tool: Tool, subject: str | None, args: dict[str, Any]) -> Verdict:
    d = agent.permissions.check(name, tool.kind, subject, agent.env)
    if d.action == DENY:
        return Verdict(DENIED, d.reason)
    if d.action == ALLOW:
        return Verdict(ALLOWED, d.reason)
    assert d.action == ASK
    rule = suggest_rule(name, tool.kind, subject)
    answer = agent.ui.approve(ApprovalRequest(name, tool.kind, subject, args, d.reason, rule))
    if answer == ALWAYS:
        agent.permissions.add_allow(rule)
    if answer in (YES, ALWAYS):
        return Verdict(APPROVED, d.reason)
    return Verdict(DENIED, "the user declined")
