"""The agent loop, built like mini-swe-agent: `run(task)` loops `step() = execute(query())`.

Control flow is carried by exceptions (`InterruptAgentFlow` and subclasses); each record reaches the trajectory
as it happens, so a crash at any point leaves a readable trajectory behind.

    run(task)
      UserPromptSubmit hook -> checkpoint at the turn start -> user message
      loop: step()
        query():   limits (steps, tokens, cost, wall time) -> auto-compaction near the context limit
                   -> model call (streamed) -> model_call record -> assistant message
        execute(): no tool calls              -> Submitted (Stop hook may send the agent back to work)
                   per tool call: parse args (FormatError) -> permission (allow / ask / deny) -> PreToolUse hook
                   -> checkpoint before -> tool.run -> checkpoint after -> PostToolUse hook -> tool message
      Submitted / LimitsExceeded / Interrupted end the turn with an exit status.

The loop knows the model only through `Model.query` and the machine only through the tools and `Environment`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent import context
from agent.checkpoints import Checkpoints
from agent.client import Cancelled, ContextLengthError, DeltaCallback, ModelResponse
from agent.environment import Environment
from agent.hooks import Hooks
from agent.permissions import ALLOW, ASK, DENY, Permissions, suggest_rule
from agent.settings import Limits
from agent.tools.base import EXECUTE, READ, ToolContext, ToolError, ToolResult, ToolState
from agent.tools.registry import ToolRegistry
from agent.trajectory import TrajectoryWriter, read_records
from agent.ui import ALWAYS, YES, AgentUI, ApprovalRequest

# exit statuses (headless maps them to exit codes)
SUBMITTED, LIMITS, INTERRUPTED, FORMAT, ERROR, BLOCKED = (
    "submitted",
    "limits_exceeded",
    "interrupted",
    "format_error",
    "error",
    "blocked",
)
TEST_COMMAND = re.compile(
    r"(^|[\s;&|(])(pytest|py\.test|python3? -m (pytest|unittest)|tox|nox|(npm|yarn|pnpm|bun)( run)? test|"
    r"cargo test|go test|make (test|check)|ctest|mvn test|gradle test|\./gradlew test)\b"
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


class Model(Protocol):
    cancel_event: threading.Event

    def query(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> ModelResponse: ...


@dataclass
class TurnResult:
    exit_status: str
    final: str = ""
    steps: int = 0


@dataclass
class Stats:
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    last_prompt_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "last_prompt_tokens": self.last_prompt_tokens,
        }


@dataclass
class AgentConfig:
    limits: Limits = field(default_factory=Limits)
    context_window: int = 131072
    compact_ratio: float = 0.85
    max_format_errors: int = 3
    input_cost_per_mtok: float = 0.0
    output_cost_per_mtok: float = 0.0
    # GLM-5 wants its earlier reasoning back (interleaved thinking); endpoints that reject the field can drop it
    send_reasoning: bool = True


class Agent:
    def __init__(
        self,
        model: Model,
        env: Environment,
        tools: ToolRegistry,
        permissions: Permissions,
        writer: TrajectoryWriter,
        config: AgentConfig | None = None,
        checkpoints: Checkpoints | None = None,
        hooks: Hooks | None = None,
        ui: AgentUI | None = None,
        system: str | None = None,
        sandbox_warning: str | None = None,
    ):
        self.model = model
        self.env = env
        self.tools = tools
        self.permissions = permissions
        self.writer = writer
        self.config = config or AgentConfig()
        self.checkpoints = checkpoints
        self.hooks = hooks
        self.ui = ui or AgentUI()
        self.sandbox_warning = sandbox_warning
        self.messages: list[dict[str, Any]] = []
        self.turns: list[dict[str, Any]] = []  # {"n_messages", "checkpoint"}: where each user turn began
        self.stats = Stats()
        self.state = ToolState()
        self.interrupt = model.cancel_event if hasattr(model, "cancel_event") else threading.Event()
        env.interrupt = self.interrupt
        self.tests: list[dict[str, Any]] = []  # test commands run and their results (outcome labels)
        self.undone_turns = 0
        self._format_errors = 0
        self._turn_start = 0.0
        self._turn_steps = 0
        if system is not None:
            self.add_message({"role": "system", "content": system})

    # -- conversation ------------------------------------------------------------------------------------------

    def add_message(self, message: dict[str, Any]) -> None:
        self.writer.write("message", index=len(self.messages), message=message)
        self.messages.append(message)
        self.ui.on_message(message)

    def system_prompt(self) -> str:
        return context.system_prompt(self.env.root, self.env.cwd, self.sandbox_warning)

    # -- a user turn -------------------------------------------------------------------------------------------

    def run(self, task: str) -> TurnResult:
        self.interrupt.clear()
        if self.hooks:
            h = self.hooks.run("UserPromptSubmit", {"prompt": task})
            self._warn(h.warnings)
            if h.blocked:
                self.ui.on_notice(f"prompt blocked by hook: {h.message}")
                return TurnResult(BLOCKED, h.message)
            if h.context:
                task = f"{task}\n\n<hook-context>\n{h.context}\n</hook-context>"
        cp = self.checkpoints.snapshot("turn start") if self.checkpoints else None
        turn = {"turn": len(self.turns) + 1, "n_messages": len(self.messages), "checkpoint": cp.commit if cp else None}
        self.turns.append(turn)
        self.writer.write("turn", **turn)
        self.add_message({"role": "user", "content": task})
        self._turn_start = time.monotonic()
        self._turn_steps = 0
        self._format_errors = 0
        stop_hook_active = False  # told to Stop hooks once they have sent the agent back, so they can let it go
        while True:
            try:
                self.step()
            except Submitted as e:
                final = str(e)
                if self.hooks:
                    h = self.hooks.run("Stop", {"final_message": final, "stop_hook_active": stop_hook_active})
                    self._warn(h.warnings)
                    if h.blocked:
                        stop_hook_active = True
                        self.add_message({"role": "user", "content": f"[Stop hook] {h.message}"})
                        continue
                return TurnResult(SUBMITTED, final, self._turn_steps)
            except RepeatedFormatError as e:
                return TurnResult(FORMAT, str(e), self._turn_steps)
            except LimitsExceeded as e:
                self.ui.on_notice(str(e))
                return TurnResult(LIMITS, str(e), self._turn_steps)
            except Interrupted as e:
                self.ui.on_notice("interrupted")
                return TurnResult(INTERRUPTED, str(e), self._turn_steps)

    def step(self) -> None:
        self.execute(self.query())

    # -- query -------------------------------------------------------------------------------------------------

    def check_limits(self) -> None:
        lim = self.config.limits
        if self._turn_steps >= lim.max_steps:
            raise LimitsExceeded(f"step limit reached ({lim.max_steps} model calls)")
        if lim.max_tokens is not None and self.stats.prompt_tokens + self.stats.completion_tokens >= lim.max_tokens:
            raise LimitsExceeded(f"token limit reached ({lim.max_tokens})")
        if lim.max_cost_usd is not None and self.stats.cost_usd >= lim.max_cost_usd:
            raise LimitsExceeded(f"cost limit reached (${lim.max_cost_usd:.2f})")
        if lim.max_wall_s is not None and time.monotonic() - self._turn_start >= lim.max_wall_s:
            raise LimitsExceeded(f"wall-time limit reached ({lim.max_wall_s:g}s)")

    def query(self) -> ModelResponse:
        self.check_limits()
        if self.interrupt.is_set():
            raise Interrupted("interrupted before the model call")
        limit = self.config.context_window * self.config.compact_ratio
        try:
            if self.stats.last_prompt_tokens and self.stats.last_prompt_tokens >= limit:
                self.compact(reason="auto")
            try:
                resp = self.model.query(self._outgoing(), self.tools.schemas(), on_delta=self.ui.on_delta)
            except ContextLengthError:
                self.ui.on_notice("the conversation no longer fits the context window: compacting")
                self.compact(reason="context length error")
                resp = self.model.query(self._outgoing(), self.tools.schemas(), on_delta=self.ui.on_delta)
        except Cancelled:
            raise Interrupted("interrupted while the model was answering") from None
        self._turn_steps += 1
        self.stats.steps += 1
        u = resp.usage or {}
        self.stats.prompt_tokens += u.get("prompt_tokens") or 0
        self.stats.completion_tokens += u.get("completion_tokens") or 0
        self.stats.last_prompt_tokens = (u.get("prompt_tokens") or 0) + (u.get("completion_tokens") or 0)
        cost = (
            (u.get("prompt_tokens") or 0) * self.config.input_cost_per_mtok
            + (u.get("completion_tokens") or 0) * self.config.output_cost_per_mtok
        ) / 1e6
        self.stats.cost_usd += cost
        self.writer.write(
            "model_call",
            step=self.stats.steps,
            n_messages=len(self.messages),
            response=resp.raw,
            usage=u,
            latency_s=round(resp.latency_s, 3),
            cost_usd=cost,
        )
        self.add_message(resp.message())
        self.ui.on_usage({**self.stats.as_dict(), "context_window": self.config.context_window})
        return resp

    def _outgoing(self) -> list[dict[str, Any]]:
        if self.config.send_reasoning:
            return self.messages
        return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in self.messages]

    # -- execute -----------------------------------------------------------------------------------------------

    def execute(self, resp: ModelResponse) -> None:
        if not resp.tool_calls:
            if resp.finish_reason == "length" and not resp.content.strip():
                self._format_error("Your reply was cut off at the output length limit. Continue, more briefly.")
                return
            raise Submitted(resp.content)
        all_bad = True
        for i, call in enumerate(resp.tool_calls):
            if self.interrupt.is_set():
                for rest in resp.tool_calls[i:]:
                    self._tool_message(rest["id"], "interrupted by the user before this call ran")
                raise Interrupted("interrupted between tool calls")
            try:
                self.execute_call(call)
                all_bad = False
            except FormatError as e:
                fn = call.get("function") or {}
                self.writer.write("tool", step=self.stats.steps, call_id=call["id"], name=fn.get("name", ""),
                                  arguments=fn.get("arguments"), decision="format_error", result=str(e),
                                  is_error=True)  # fmt: skip
                self._tool_message(call["id"], f"error: {e}")
        if all_bad:
            self._format_errors += 1
            if self._format_errors >= self.config.max_format_errors:
                raise RepeatedFormatError(f"{self._format_errors} malformed tool calls in a row")
        else:
            self._format_errors = 0

    def _format_error(self, text: str) -> None:
        self._format_errors += 1
        if self._format_errors >= self.config.max_format_errors:
            raise RepeatedFormatError(f"{self._format_errors} malformed replies in a row")
        self.add_message({"role": "user", "content": text})

    def _tool_message(self, call_id: str, content: str) -> None:
        self.add_message({"role": "tool", "tool_call_id": call_id, "content": content})

    def execute_call(self, call: dict[str, Any]) -> None:
        fn = call.get("function") or {}
        name = fn.get("name", "")
        tool = self.tools.get(name)
        if tool is None:
            raise FormatError(f"there is no tool named {name!r}; available: {', '.join(self.tools.names())}")
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError as e:
            raise FormatError(f"the arguments of {name} are not valid JSON ({e}); send a JSON object") from None
        if not isinstance(args, dict):
            raise FormatError(f"the arguments of {name} must be a JSON object")

        subject = tool.subject(args)
        record: dict[str, Any] = {"step": self.stats.steps, "call_id": call["id"], "name": name, "arguments": args}
        decision = self.permissions.check(name, tool.kind, subject, self.env)
        verdict = "allow"
        if decision.action == ASK:
            answer = self.ui.approve(
                ApprovalRequest(name, tool.kind, subject, args, decision.reason, suggest_rule(name, tool.kind, subject))
            )
            if answer == ALWAYS:
                self.permissions.add_allow(suggest_rule(name, tool.kind, subject))
            verdict = "approved" if answer in (YES, ALWAYS) else "denied"
            if verdict == "denied":
                decision = type(decision)(DENY, "the user declined")
        if decision.action == DENY:
            text = f"permission denied: {decision.reason}. Do something else, or ask the user."
            self.writer.write("tool", **record, decision="denied", reason=decision.reason, result=text, is_error=True)
            self._tool_message(call["id"], text)
            return
        assert decision.action in (ALLOW, ASK)

        if self.hooks:
            h = self.hooks.run("PreToolUse", {"tool_name": name, "tool_input": args}, tool_name=name)
            self._warn(h.warnings)
            if h.blocked:
                text = f"blocked by a PreToolUse hook: {h.message}"
                self.writer.write("tool", **record, decision="blocked", result=text, is_error=True)
                self._tool_message(call["id"], text)
                return

        mutating = tool.kind != READ and name != "todo"
        before = self.checkpoints.snapshot(f"before {name}") if (self.checkpoints and mutating) else None
        self.ui.on_tool_start(name, args)
        t0 = time.monotonic()
        try:
            result = tool.run(args, ToolContext(self.env, self.state))
        except ToolError as e:
            result = ToolResult(f"error: {e}", is_error=True)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a tool bug must not kill the session; the model sees what happened
            result = ToolResult(f"error: {name} failed: {type(e).__name__}: {e}", is_error=True)
        duration = time.monotonic() - t0
        after = self.checkpoints.snapshot(f"after {name}") if (self.checkpoints and mutating) else None

        if self.hooks:
            h = self.hooks.run(
                "PostToolUse",
                {"tool_name": name, "tool_input": args, "tool_response": {"output": result.output, **result.data}},
                tool_name=name,
            )
            self._warn(h.warnings)
            if h.blocked:
                result.output += f"\n[PostToolUse hook] {h.message}"
        if tool.kind == EXECUTE and name == "bash" and TEST_COMMAND.search(args.get("command", "")):
            rc = result.data.get("returncode")
            test = {"command": args["command"], "returncode": rc, "passed": rc == 0}
            self.tests.append(test)
        self.writer.write(
            "tool",
            **record,
            decision=verdict,
            result=result.output,
            is_error=result.is_error,
            data={k: v for k, v in result.data.items() if k != "todos"},
            duration_s=round(duration, 3),
            checkpoint=before.ref if before else None,
            commit_before=before.commit if before else None,
            commit_after=after.commit if after else None,
        )
        self.ui.on_tool_end(name, result)
        self._tool_message(call["id"], result.output)

    def _warn(self, warnings: list[str]) -> None:
        for w in warnings:
            self.ui.on_notice(w)

    # -- compaction --------------------------------------------------------------------------------------------

    def compact(self, focus: str | None = None, reason: str = "user") -> bool:
        """Summarize the conversation and restart it from the summary, instruction files re-read. False if blocked."""
        if self.hooks:
            h = self.hooks.run("PreCompact", {"trigger": "manual" if reason == "user" else "auto", "focus": focus})
            self._warn(h.warnings)
            if h.blocked:
                self.ui.on_notice(f"compaction blocked by hook: {h.message}")
                return False
        msgs = self.messages
        # The conversation may itself be too long to summarize: drop the oldest half of it until it fits.
        keep = list(msgs[1:])
        while True:
            try:
                resp = self.model.query(context.summary_request(msgs[:1] + keep, focus), None)
                break
            except ContextLengthError:
                if len(keep) <= 2:
                    raise
                keep = context.drop_oldest_half(keep)
        summary = resp.content or ""
        last_user = None
        if reason != "user":
            users = [m for m in msgs if m.get("role") == "user" and isinstance(m.get("content"), str)]
            last_user = users[-1]["content"] if users else None
        new = context.compacted(self.system_prompt(), summary, last_user)
        u = resp.usage or {}
        self.stats.prompt_tokens += u.get("prompt_tokens") or 0
        self.stats.completion_tokens += u.get("completion_tokens") or 0
        self.stats.last_prompt_tokens = 0
        self.writer.write(
            "compaction", reason=reason, summary=summary, messages=new, n_before=len(msgs), response=resp.raw
        )
        self.messages = list(new)
        # turns before the compaction can no longer be rewound to message-wise; keep their code checkpoints only
        self.turns = []
        self.ui.on_notice(f"compacted {len(msgs)} messages into a summary ({reason})")
        return True

    # -- undo / rewind -----------------------------------------------------------------------------------------

    def rewind(self, n: int = 1) -> dict[str, Any]:
        """Undo the last `n` user turns: the working tree and the conversation go back to before them."""
        if n < 1 or n > len(self.turns):
            raise ValueError(f"can rewind 1..{len(self.turns)} turns, not {n}")
        target = self.turns[-n]
        saved = None
        if self.checkpoints and target.get("checkpoint"):
            saved = self.checkpoints.restore(target["checkpoint"])
        del self.messages[target["n_messages"] :]
        del self.turns[-n:]
        self.undone_turns += n
        self.state.read_files.clear()  # files may differ from what the model read
        rec = {
            "to_turn": target["turn"],
            "n_turns": n,
            "n_messages": target["n_messages"],
            "checkpoint": target.get("checkpoint"),
            "saved_as": saved.commit if saved else None,
        }
        self.writer.write("rewind", **rec)
        return rec

    # -- end ---------------------------------------------------------------------------------------------------

    def finish(self, exit_status: str, final: str = "") -> None:
        labels: dict[str, Any] = {"tests": self.tests, "undone_turns": self.undone_turns}
        if self.tests:
            labels["tests_passed"] = self.tests[-1]["passed"]
        if self.checkpoints and self.checkpoints.enabled:
            end = self.checkpoints.snapshot("session end")
            first = self._first_checkpoint()
            if end and first:
                changed = self.checkpoints.changed_files(first, end.commit)
                labels.update(files_changed=changed, diff_kept=bool(changed), commit_start=first, commit_end=end.commit)
        self.writer.write("outcome", labels=labels)
        self.writer.write("end", exit_status=exit_status, stats=self.stats.as_dict(), final=final)
        self.env.close()

    def _first_checkpoint(self) -> str | None:
        for r in read_records(self.writer.path):
            if r.get("type") == "turn" and r.get("checkpoint"):
                return r["checkpoint"]
        return None
