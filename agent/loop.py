"""The agent loop, built like mini-swe-agent: `run(task)` loops `step() = execute(query())`.

Control flow is carried by exceptions (agent/flow.py); each record reaches the trajectory as it happens, so a
crash at any point leaves a readable trajectory behind.

    run(task)
      UserPromptSubmit hook -> checkpoint at the turn start -> user message
      loop: step()
        query():   limits (stats.py) -> auto-compaction near the context limit (compact(), below)
                   -> model call (streamed) -> model_call record -> assistant message
        execute(): no tool calls -> Submitted (a Stop hook may send the agent back to work)
                   each tool call -> tool_call.run_call (approval, hooks, checkpoints, the tool, the record)
      Submitted / LimitsExceeded / Interrupted end the turn with an exit status.
    finish(): outcome labels (labels(): the test runs outcomes.py labelled, the files changed) and the `end`
    record.

The agent owns its state: the conversation, the turns, the stats and the labels change only through its methods.
    compact(focus, reason)  PreCompact hook (may block) -> the model summarizes (the oldest half dropped until the
                            request fits) -> context.compacted(system prompt re-read from disk, summary, the last
                            request when automatic; the screen of each terminal session still open) ->
                            `compaction` record -> the messages replaced; earlier turns can no longer be rewound
    rewind(n)               the last n user turns undone, code and conversation (/undo, /rewind N): the turn's
                            checkpoint restored (the present snapshot first), the conversation cut, a `rewind`
                            record, which `Trajectory.messages()` replays on resume
tool_call.py and approval.py see the agent through the narrow protocols they declare, never this module.

The loop knows the model only through `Model.query` and the machine only through the tools and `Environment`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent import context, tool_call
from agent.checkpoints import Checkpoints
from agent.client import Cancelled, ContextLengthError, DeltaCallback, ModelResponse
from agent.environment import Environment
from agent.flow import (  # noqa: F401 - re-exported: the statuses and exceptions are the loop's vocabulary
    BLOCKED,
    ERROR,
    FORMAT,
    INTERRUPTED,
    LIMITS,
    SUBMITTED,
    FormatError,
    InterruptAgentFlow,
    Interrupted,
    LimitsExceeded,
    RepeatedFormatError,
    Submitted,
)
from agent.hooks import Hooks
from agent.permissions import Permissions
from agent.settings import Limits
from agent.stats import Stats, check_limits
from agent.tools.base import ToolState
from agent.tools.registry import ToolRegistry
from agent.trajectory import TrajectoryWriter, read_records
from agent.ui import AgentUI


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
class AgentConfig:
    limits: Limits = field(default_factory=Limits)
    context_window: int = 131072
    compact_ratio: float = 0.85
    max_format_errors: int = 3
    input_cost_per_mtok: float = 0.0
    output_cost_per_mtok: float = 0.0
    # GLM-5 wants its earlier reasoning back (interleaved thinking); endpoints that reject the field can drop it
    send_reasoning: bool = True
    profile: str = "full"  # agent/profiles.py: the system prompt rebuilt at compaction is this profile's


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
        self.model, self.env, self.tools, self.permissions, self.writer = model, env, tools, permissions, writer
        self.config = config or AgentConfig()
        self.checkpoints, self.hooks = checkpoints, hooks
        self.ui = ui or AgentUI()
        self.sandbox_warning = sandbox_warning
        self.messages: list[dict[str, Any]] = []
        self.turns: list[dict[str, Any]] = []  # {"turn", "n_messages", "checkpoint"}: where each user turn began
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

    def add_message(self, message: dict[str, Any]) -> None:
        self.writer.write("message", index=len(self.messages), message=message)
        self.messages.append(message)
        self.ui.on_message(message)

    def tool_message(self, call_id: str, content: str) -> None:
        self.add_message({"role": "tool", "tool_call_id": call_id, "content": content})

    def system_prompt(self) -> str:
        return context.system_prompt(self.env.root, self.env.cwd, self.sandbox_warning, profile=self.config.profile,
                                     shown_root=self.env.shown_root, date=self.env.shown_date)  # fmt: skip

    def warn(self, warnings: list[str]) -> None:
        for w in warnings:
            self.ui.on_notice(w)

    # -- a user turn -------------------------------------------------------------------------------------------

    def run(self, task: str) -> TurnResult:
        self.interrupt.clear()
        if self.hooks:
            h = self.hooks.run("UserPromptSubmit", {"prompt": task})
            self.warn(h.warnings)
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
        self._turn_start, self._turn_steps, self._format_errors = time.monotonic(), 0, 0
        stop_hook_active = False  # told to Stop hooks once they have sent the agent back, so they can let it go
        while True:
            try:
                self.step()
            except Submitted as e:
                if self.hooks:
                    h = self.hooks.run("Stop", {"final_message": str(e), "stop_hook_active": stop_hook_active})
                    self.warn(h.warnings)
                    if h.blocked:
                        stop_hook_active = True
                        self.add_message({"role": "user", "content": f"[Stop hook] {h.message}"})
                        continue
                return TurnResult(SUBMITTED, str(e), self._turn_steps)
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

    def query(self) -> ModelResponse:
        check_limits(self.stats, self.config.limits, self._turn_steps, self._turn_start)
        if self.interrupt.is_set():
            raise Interrupted("interrupted before the model call")
        try:
            last = self.stats.last_prompt_tokens
            if last and last >= self.config.context_window * self.config.compact_ratio:
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
        u = resp.usage or {}
        cost = self.stats.add_call(u, self.config.input_cost_per_mtok, self.config.output_cost_per_mtok)
        self.writer.write("model_call", step=self.stats.steps, n_messages=len(self.messages), response=resp.raw,
                          usage=u, latency_s=round(resp.latency_s, 3), cost_usd=cost)  # fmt: skip
        self.add_message(resp.message())
        self.ui.on_usage({**self.stats.as_dict(), "context_window": self.config.context_window})
        return resp

    def _outgoing(self) -> list[dict[str, Any]]:
        if self.config.send_reasoning:
            return self.messages
        return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in self.messages]

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
                    self.tool_message(rest["id"], "interrupted by the user before this call ran")
                raise Interrupted("interrupted between tool calls")
            try:
                tool_call.run_call(self, call)
                all_bad = False
            except FormatError as e:
                fn = call.get("function") or {}
                self.ui.on_tool_decision(call["id"], fn.get("name", ""), fn.get("arguments"), "format_error", str(e))
                self.writer.write("tool", step=self.stats.steps, call_id=call["id"], name=fn.get("name", ""),
                                  arguments=fn.get("arguments"), decision="format_error", result=str(e),
                                  is_error=True)  # fmt: skip
                self.tool_message(call["id"], f"error: {e}")
        if not all_bad:
            self._format_errors = 0
        else:
            self._format_errors += 1
            if self._format_errors >= self.config.max_format_errors:
                raise RepeatedFormatError(f"{self._format_errors} malformed tool calls in a row")

    def _format_error(self, text: str) -> None:
        self._format_errors += 1
        if self._format_errors >= self.config.max_format_errors:
            raise RepeatedFormatError(f"{self._format_errors} malformed replies in a row")
        self.add_message({"role": "user", "content": text})

    # -- what the commands and the interfaces call -------------------------------------------------------------

    def compact(self, focus: str | None = None, reason: str = "user") -> bool:
        """Summarize the conversation and restart it from the summary, instruction files re-read. False if blocked.
        The loop calls it near the context limit and after a context-length error; /compact with a focus."""
        if self.hooks:
            h = self.hooks.run("PreCompact", {"trigger": "manual" if reason == "user" else "auto", "focus": focus})
            self.warn(h.warnings)
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
        terms = getattr(self.env, "_terminals", None)
        if terms is not None and (screens := terms.live_screens()):
            new[1] = {**new[1], "content": new[1]["content"] + "\n\n" + screens}  # a live session's latest screen
        u = resp.usage or {}
        self.stats.prompt_tokens += u.get("prompt_tokens") or 0
        self.stats.completion_tokens += u.get("completion_tokens") or 0
        self.stats.last_prompt_tokens = 0
        self.writer.write("compaction", reason=reason, summary=summary, messages=new, n_before=len(msgs),
                          response=resp.raw)  # fmt: skip
        self.messages = list(new)
        # turns before the compaction can no longer be rewound to message-wise; keep their code checkpoints only
        self.turns = []
        self.ui.on_notice(f"compacted {len(msgs)} messages into a summary ({reason})")
        return True

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

    def labels(self) -> dict[str, Any]:
        """The outcome labels: {"tests", "tests_passed", "undone_turns", "files_changed", "diff_kept",
        "commit_start", "commit_end"}, for the bench and for training."""
        out: dict[str, Any] = {"tests": self.tests, "undone_turns": self.undone_turns}
        if self.tests:
            out["tests_passed"] = self.tests[-1]["passed"]
        cps = self.checkpoints
        if cps and cps.enabled:
            end = cps.snapshot("session end")
            first = self.first_checkpoint()
            if end and first:
                changed = cps.changed_files(first, end.commit)
                out.update(files_changed=changed, diff_kept=bool(changed), commit_start=first, commit_end=end.commit)
        return out

    def first_checkpoint(self) -> str | None:
        """The working tree's snapshot at the session's first turn (in this or an earlier process)."""
        for r in read_records(self.writer.path):
            if r.get("type") == "turn" and r.get("checkpoint"):
                return r["checkpoint"]
        return None

    def finish(self, exit_status: str, final: str = "") -> None:
        self.writer.write("outcome", labels=self.labels())
        self.writer.write("end", exit_status=exit_status, stats=self.stats.as_dict(), final=final)
        self.env.close()
