"""One tool call from the model's reply, carried out and recorded.

    run_call(agent, call)
      tool lookup, JSON arguments, required arguments present (FormatError) -> what the tool refuses before any
      approval prompt (an edit of a file not read) -> approval.decide (allow / ask / deny)
      -> PreToolUse hook (may block) -> checkpoint before -> tool.run -> checkpoint after
      -> PostToolUse hook (may add to the result) -> test-run label -> `tool` record -> tool message

Every way a call can end (denied, blocked, failed, done) leaves one `tool` record with its `decision` and one
tool message answering the call, so the conversation stays well formed. Sees the agent only as `Caller`.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Protocol

from agent import approval, outcomes
from agent.flow import FormatError
from agent.tools.base import EXECUTE, READ, ToolContext, ToolError, ToolResult, ToolState, missing_argument

if TYPE_CHECKING:
    from agent.checkpoints import Checkpoints
    from agent.hooks import Hooks
    from agent.stats import Stats
    from agent.tools.registry import ToolRegistry


class Caller(approval.Approver, Protocol):
    """What a tool call needs of the agent (agent/loop.py's Agent is one): approval's needs, and the tools, the
    hooks, the checkpoints, the test-run labels and the conversation's tool messages."""

    tools: ToolRegistry
    stats: Stats
    hooks: Hooks | None
    checkpoints: Checkpoints | None
    state: ToolState
    tests: list[dict[str, Any]]

    def warn(self, warnings: list[str]) -> None: ...

    def tool_message(self, call_id: str, content: str) -> None: ...


def parse(agent: Caller, call: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    fn = call.get("function") or {}
    name = fn.get("name", "")
    tool = agent.tools.get(name)
    if tool is None:
        raise FormatError(f"there is no tool named {name!r}; available: {', '.join(agent.tools.names())}")
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError as e:
        raise FormatError(f"the arguments of {name} are not valid JSON ({e}); send a JSON object") from None
    if not isinstance(args, dict):
        raise FormatError(f"the arguments of {name} must be a JSON object")
    # A call without an argument its schema requires cannot run: say so before anyone is asked to approve it.
    required = (tool.parameters or {}).get("required")  # an MCP server's schema may be anything
    missing = [k for k in required if isinstance(k, str) and k not in args] if isinstance(required, list) else []
    if missing:
        raise FormatError(missing_argument(missing[0]))
    return name, tool, args


def run_call(agent: Caller, call: dict[str, Any]) -> None:
    name, tool, args = parse(agent, call)
    subject = tool.subject(args)
    record: dict[str, Any] = {"step": agent.stats.steps, "call_id": call["id"], "name": name, "arguments": args}

    refused = _refused_before_asking(agent, tool, args)
    if refused is not None:  # asking the user to approve a call that cannot run would waste their yes
        agent.ui.on_tool_start(name, args)
        result = ToolResult(f"error: {refused}", is_error=True)
        agent.writer.write("tool", **record, decision="unasked", result=result.output, is_error=True, failed="call")
        agent.ui.on_tool_end(name, result)
        agent.tool_message(call["id"], result.output)
        return
    verdict = approval.decide(agent, name, tool, subject, args)
    agent.ui.on_tool_decision(call["id"], name, args, verdict.decision, verdict.reason)
    if not verdict.runs:
        text = f"permission denied: {verdict.reason}. " + (
            f"The user says: {verdict.message}" if verdict.message else "Do something else, or ask the user."
        )
        agent.writer.write("tool", **record, decision=verdict.decision, reason=verdict.reason,
                           user_message=verdict.message or None, result=text, is_error=True)  # fmt: skip
        agent.tool_message(call["id"], text)
        return

    blocked = _pre_tool_use(agent, name, args, verdict.command) if agent.hooks else None
    if blocked is not None:
        text = f"blocked by a PreToolUse hook: {blocked}"
        agent.ui.on_tool_decision(call["id"], name, args, "blocked", text)
        agent.writer.write("tool", **record, decision="blocked", result=text, is_error=True)
        agent.tool_message(call["id"], text)
        return

    mutating = tool.kind != READ and name != "todo"
    cps = agent.checkpoints if mutating else None
    before = cps.snapshot(f"before {name}") if cps else None
    agent.ui.on_tool_start(name, args)
    t0 = time.monotonic()
    failed = None  # "call": the tool refused the call as made (the model's mistake); "crash": a bug in the tool
    try:
        result = tool.run(args, ToolContext(agent.env, agent.state))
    except ToolError as e:
        result, failed = ToolResult(f"error: {e}", is_error=True), "call"
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a tool bug must not kill the session; the model sees what happened
        result, failed = ToolResult(f"error: {name} failed: {type(e).__name__}: {e}", is_error=True), "crash"
    duration = time.monotonic() - t0
    after = cps.snapshot(f"after {name}") if cps else None

    if agent.hooks:
        _post_tool_use(agent, name, args, result)
    if tool.kind == EXECUTE and name == "bash":
        test = outcomes.label_test_run(args.get("command", ""), result)
        if test is not None:
            agent.tests.append(test)
    agent.writer.write(
        "tool",
        **record,
        decision=verdict.decision,
        result=result.output,
        is_error=result.is_error,
        **({"failed": failed} if failed else {}),
        data={k: v for k, v in result.data.items() if k != "todos"},
        duration_s=round(duration, 3),
        checkpoint=before.ref if before else None,
        commit_before=before.commit if before else None,
        commit_after=after.commit if after else None,
    )
    agent.ui.on_tool_end(name, result)
    agent.tool_message(call["id"], result.output)


def _pre_tool_use(agent: Caller, name: str, args: dict[str, Any], command: str) -> str | None:
    """The PreToolUse hooks on the call (and on `command`, a line a terminal's shell will run, as the hooks on bash
    see it too): the message of the hook that blocked it, or None."""
    h = agent.hooks.run("PreToolUse", {"tool_name": name, "tool_input": args}, tool_name=name)
    agent.warn(h.warnings)
    if not h.blocked and command:
        h = agent.hooks.run("PreToolUse", {"tool_name": "bash", "tool_input": {"command": command}}, tool_name="bash")
        agent.warn(h.warnings)
    return h.message if h.blocked else None


def _post_tool_use(agent: Caller, name: str, args: dict[str, Any], result: ToolResult) -> None:
    """The PostToolUse hooks on a call that ran: a blocking hook's message is added to the result."""
    h = agent.hooks.run(
        "PostToolUse",
        {"tool_name": name, "tool_input": args, "tool_response": {"output": result.output, **result.data}},
        tool_name=name,
    )
    agent.warn(h.warnings)
    if h.blocked:
        result.output += f"\n[PostToolUse hook] {h.message}"


def _refused_before_asking(agent: Caller, tool: Any, args: dict[str, Any]) -> str | None:
    """A tool's `refuses(args, ctx)` (an edit of a file the model has not read): why it would refuse the call as
    made, checked before the approval prompt, or None."""
    refuses = getattr(tool, "refuses", None)
    if refuses is None:
        return None
    try:
        refuses(args, ToolContext(agent.env, agent.state))
    except ToolError as e:
        return str(e)
    except (OSError, ValueError, TypeError):  # left for the run itself to report
        return None
    return None
