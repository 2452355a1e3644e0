"""Scripted task families: in-process environments with a checkable reward, for tests and benchmarks.

A task asks for an answer that contains a pattern (a digit, by default); the session lets the model try up to
`turns` times, answering each miss with feedback as a tool result (`feedback="tool"`: the conversation only
grows, one branch) or as a user message (`"user"`: GLM-5's template then drops the earlier reasoning, a new
branch per turn). The reward is 1.0 if some reply matched. `tiny` learns this in a few dozen steps, which is
what the learning-curve benchmark and the tests need. Optional knobs exercise the run's rules: `crash`
(task, sample) -> True makes that session's environment fail; `grade_cmd` grades in a real subprocess (a
test suite's latency); `tools` puts tool schemas in the prompt.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
        from agent.client import ContextLengthError

        rx = re.compile(self.task.pattern)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.task.instruction}]
        for turn in range(self.family.turns):
            try:
                resp = model.query(messages, self.family.tools)
            except ContextLengthError:
                return
            messages.append(resp.message())
            self.replies.append((resp.reasoning_content or "") + (resp.content or ""))
            if rx.search(self.replies[-1]) or turn == self.family.turns - 1:
                return
            note = f"no match for {self.task.pattern} yet; try again"
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

    def reset(self, task: ScriptedTask, workdir: Path, sample: int = 0) -> ScriptedSession:
        return ScriptedSession(self, task, sample)
