"""Scripted task families: in-process environments with a checkable reward, for tests and benchmarks.

A task asks for an answer that contains a pattern (a digit, by default); the session lets the model try up to
`turns` times, answering each miss with feedback as a tool result (`feedback="tool"`: the conversation only
grows, one branch) or as a user message (`"user"`: GLM-5's template then drops the earlier reasoning, a new
branch per turn). The reward is 1.0 if some reply matched. `tiny` learns this in a few dozen steps, which is
what the learning-curve benchmark and the tests need. Optional knobs exercise the run's rules: `crash`
(task, sample) -> True makes that session's environment fail; `grade_cmd` grades in a real subprocess (a
test suite's latency); `tools` puts tool schemas in the prompt; `lengths` (task, sample) -> n makes that session
run exactly n turns whatever it answers (a follow-up after each reply; the reward is still whether a reply
matched): agentic sessions' long tail of lengths, which is what asynchronous RL exists to absorb; `tool_s` makes
every tool result take that many seconds of wall time before the session goes on (a sandboxed test run on
another machine: the session waits, the rollout engine does not).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.client import ContextLengthError
from finetune.rl.rollout import ENV_ERROR, Grade

SYSTEM = "You are a helpful assistant. Answer briefly."


@dataclass(frozen=True)
class ScriptedTask:
    name: str
    instruction: str
    pattern: str = r"[0-9]"


def digit_tasks(n: int = 8) -> list[ScriptedTask]:
    prompts = ["count to three", "how many legs has a cat", "what year is it", "pick a number", "add one and one",
               "name a port", "how old is the sun", "give me a phone code", "a prime", "a square"]  # fmt: skip
    return [ScriptedTask(f"digit-{i}", prompts[i % len(prompts)]) for i in range(n)]


class EnvCrash(RuntimeError):
    pass


class ScriptedSession:
    def __init__(self, family: ScriptedFamily, task: ScriptedTask, sample: int):
        self.family, self.task, self.sample = family, task, sample
        self.replies: list[str] = []
        if family.crash is not None and family.crash(task.name, sample):
            raise EnvCrash(f"{task.name}: the sandbox did not start (scripted crash)")

    def run(self, model) -> None:
        rx = re.compile(self.task.pattern)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.task.instruction}]
        fixed = self.family.lengths(self.task.name, self.sample) if self.family.lengths is not None else None
        turns = fixed if fixed is not None else self.family.turns
        for turn in range(turns):
            try:
                resp = model.query(messages, self.family.tools)
            except ContextLengthError:
                return
            messages.append(resp.message())
            self.replies.append((resp.reasoning_content or "") + (resp.content or ""))
            if turn == turns - 1 or (fixed is None and rx.search(self.replies[-1])):
                return
            if self.family.tool_s > 0:
                time.sleep(self.family.tool_s)
            note = "go on" if fixed is not None else f"no match for {self.task.pattern} yet; try again"
            if self.family.feedback == "tool":
                messages.append({"role": "tool", "tool_call_id": f"check-{turn}", "content": note})
            else:
                messages.append({"role": "user", "content": note})

    def grade(self) -> Grade:
        if self.family.grade_cmd is not None:
            text = "\n".join(self.replies)
            p = subprocess.run(self.family.grade_cmd, input=text, capture_output=True, text=True, timeout=60)
            if p.returncode not in (0, 1):
                return Grade(None, None, ENV_ERROR, f"grader exited {p.returncode}: {p.stderr[-300:]}")
            return Grade(float(p.returncode == 0), p.returncode == 0)
        ok = any(re.search(self.task.pattern, r) for r in self.replies)
        return Grade(float(ok), ok, detail={"turns": len(self.replies)})

    def close(self) -> None:
        pass


@dataclass
class ScriptedFamily:
    turns: int = 1
    feedback: str = "tool"
    crash: Callable[[str, int], bool] | None = None
    grade_cmd: list[str] | None = None
    tools: list[dict] | None = None
    name: str = "scripted"
    lengths: Callable[[str, int], int] | None = None
    tool_s: float = 0.0

    def reset(self, task: ScriptedTask, workdir: Path, sample: int = 0) -> ScriptedSession:
        return ScriptedSession(self, task, sample)


def long_tail_lengths(task: str, sample: int) -> int:
    """Turns of a session drawn from a long tail, fixed by (task, sample): 1 (half), 2 (a quarter), 4 (15%) or
    12 (10%) turns, mean 2.8. In a group of 16, one session runs 12 turns four times in five: a synchronous step
    waits for it while the engine decodes a batch of one or two."""
    u = int.from_bytes(hashlib.sha256(f"{task}:{sample}".encode()).digest()[:4], "big") / 2**32
    return 1 if u < 0.5 else 2 if u < 0.75 else 4 if u < 0.9 else 12
