"""Approval: may one tool call run? The permission rules decide, and where they say "ask" the user answers.

    decide(agent, name, tool, subject, args) -> Verdict
      permissions.check -> allow | deny, or ask -> ui.approve(ApprovalRequest with the narrowest rule and a
      preview: the edit's diff, the command in full) -> yes | no (+ a message for the model) | always
      "always" allows the proposed rule (or the user's edit of it) for the session, and saves it to the
      repository's or the user's settings when the user chose one.

The verdict's `decision` is what the trajectory records (allow | approved | denied) and `reason` what the model
is told when the call is refused. Knows nothing of running the tool, and sees the agent only as `Approver` (its
rules, its environment, its user and its record).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent.permissions import ALLOW, ASK, DENY, Permissions, Rule, narrowest_rule, suggest_rule
from agent.settings import save_rule
from agent.tools.base import EDIT, EXECUTE
from agent.tools.write import unified_diff
from agent.ui import ALWAYS, NO, YES, AgentUI, Answer, ApprovalRequest

if TYPE_CHECKING:
    from agent.environment import Environment
    from agent.tools.base import Tool
    from agent.trajectory import TrajectoryWriter

ALLOWED, APPROVED, DENIED = "allow", "approved", "denied"
MAX_PREVIEW_CHARS = 20_000


class Approver(Protocol):
    """What approval needs of the agent (agent/loop.py's Agent is one)."""

    permissions: Permissions
    env: Environment
    ui: AgentUI
    writer: TrajectoryWriter


@dataclass(frozen=True)
class Verdict:
    decision: str  # ALLOWED | APPROVED | DENIED
    reason: str
    message: str = ""  # the user's words with a "no": what to do instead
    command: str = ""  # the command line a terminal call will have a shell run (its bash PreToolUse hooks run)

    @property
    def runs(self) -> bool:
        return self.decision != DENIED


def proposed_rule(name: str, kind: str, subject: str | None, rel_path: str | None = None) -> str:
    """The narrowest rule that allows this call: `bash(python -m pytest:*)` for `python -m pytest -q`."""
    if kind == EXECUTE and subject:
        return narrowest_rule(subject)
    if kind == EDIT and rel_path:
        return f"{name}({rel_path})"  # this file, not every edit (accept-edits mode is that)
    return suggest_rule(name, kind, subject)


def preview(agent: Approver, name: str, kind: str, args: dict[str, Any]) -> str:
    """What the call would do, for the user to judge before answering: the full command, or the edit's diff
    (computed on a copy; nothing is written)."""
    if kind == EXECUTE and "command" in args:
        return str(args["command"])
    if kind == EDIT and isinstance(args.get("path"), str):
        try:
            path = agent.env.resolve(args["path"])
            before = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
            rel = agent.env.display(path)
        except (OSError, ValueError):
            return ""
        if name == "write" and isinstance(args.get("content"), str):
            after = args["content"]
        elif isinstance(args.get("old_string"), str) and isinstance(args.get("new_string"), str):
            old, new = args["old_string"], args["new_string"]
            if not old or old not in before:
                return f"(old_string not found in {rel}: the edit will fail)"
            after = before.replace(old, new) if args.get("replace_all") else before.replace(old, new, 1)
        else:
            return ""
        return unified_diff(before, after, rel)[:MAX_PREVIEW_CHARS] or "(no change)"
    return json.dumps(args, ensure_ascii=False, indent=1)[:MAX_PREVIEW_CHARS]


def judged(agent: Approver, name: str, j: Any) -> Verdict | None:
    """A tool that runs what it is sent (the terminal tools, agent/tools/terminal.py) says what would run: that
    command line is checked as `bash` would check it, under `bash` rules; keystrokes that run nothing are
    allowed, except in plan mode or under a deny rule naming the tool. None: `j.subject` is checked as a command."""
    p = agent.permissions
    if any(r.matches_tool(name) and r.specifier is None for r in p.deny):
        return Verdict(DENIED, f"denied by rule {name}")
    if j.refuse:
        return Verdict(DENIED, j.refuse)
    if j.subject is not None:
        return None
    if p.mode == "plan" and name != "terminal_open":
        return Verdict(DENIED, "plan mode is read-only: no keystrokes to programs")
    return Verdict(ALLOWED, j.reason)


def decide(agent: Approver, name: str, tool: Tool, subject: str | None, args: dict[str, Any]) -> Verdict:
    if callable(getattr(tool, "judge", None)):
        j = tool.judge(args, agent.env)
        if (v := judged(agent, name, j)) is not None:
            return v
        v = _decide(agent, name, tool, j.subject, args, "bash", j.preview)
        return Verdict(v.decision, v.reason, v.message, command=j.subject or "")
    return _decide(agent, name, tool, subject, args, name, "")


def _decide(agent: Approver, name: str, tool: Tool, subject: str | None, args: dict[str, Any], pname: str,
            shown: str) -> Verdict:  # fmt: skip
    """`pname`: the tool name the rules are matched under (`bash` for a terminal's line); `shown`: the preview."""
    d = agent.permissions.check(pname, tool.kind, subject, agent.env)
    if d.action == DENY:
        return Verdict(DENIED, d.reason)
    if d.action == ALLOW:
        return Verdict(ALLOWED, d.reason)
    assert d.action == ASK
    rel = None
    if tool.kind == EDIT and subject:
        try:
            rel = agent.env.display(agent.env.resolve(subject))
        except (OSError, ValueError):
            rel = None
    rule = proposed_rule(name, tool.kind, subject, rel)
    shown = shown or preview(agent, name, tool.kind, args)
    req = ApprovalRequest(name, tool.kind, subject, args, d.reason, rule, shown)
    answer = agent.ui.approve(req)
    if not isinstance(answer, Answer):
        answer = Answer(answer if answer in (YES, NO, ALWAYS) else NO)
    if answer.choice == ALWAYS:
        always(agent, answer.rule or rule, answer.save)
    if answer.choice in (YES, ALWAYS):
        return Verdict(APPROVED, d.reason)
    return Verdict(DENIED, answer.reason or "the user declined", answer.message.strip())


def always(agent: Approver, rule: str, save: str | None) -> None:
    """Allow `rule` from now on; saved to settings (`save` = "repo" | "user") it holds for later sessions too."""
    try:
        Rule.parse(rule)
    except ValueError as e:
        agent.ui.on_notice(f"{e}; nothing was added")
        return
    agent.permissions.add_allow(rule)
    agent.writer.write("permission_rule", rule=rule, kind="allow", scope=save or "session")
    if save in ("repo", "user"):
        try:
            where = save_rule(rule, kind="allow", scope=save, root=agent.env.root)
        except (OSError, ValueError) as e:
            agent.ui.on_notice(f"could not save {rule} to the {save} settings: {e}")
            return
        agent.ui.on_notice(f"allowed {rule}; saved to {where or save + ' settings'}")
    else:
        agent.ui.on_notice(f"allowed {rule} for this session")
