"""The environment protocol the orchestrator runs sessions in, small as mini-swe-agent's.

    session = env.reset(task, workdir, sample)  # a fresh per-trial environment: attempt `sample` at `task`
    session.run(model)                    # the agent works in it, talking to `model` (a SessionModel)
    grade = session.grade()               # Grade(reward, solved, status): ENV_ERROR when the environment failed
    session.close()

An exception from `reset`, `run` or `grade` (other than the rollout server failing) is an environment crash:
the rollout is recorded as ENV_ERROR with the error, and the buffer's crash-group rule decides about its group.
A grade with status UNSCORED (the session ran, its reward's checker could not) is no crash: the session stays in
its group without an advantage, and a step in which no session could be scored stops the run (RewardUnavailable).
Implementations: `scripted.ScriptedFamily` (in-process task families for tests and benchmarks),
`bench_env.BenchEnv` (the bench's SWE / terminal tasks, sandboxes and grading, with `glm5 code`'s agent loop) and
`completion.CompletionEnv` (one completion of a prompt, scored by its task's reward: `--env completion`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from finetune.rl.rollout import Grade


class EnvSession(Protocol):
    def run(self, model: Any) -> None: ...

    def grade(self) -> Grade: ...

    def close(self) -> None: ...


class RolloutEnv(Protocol):
    name: str
    # Optional `single_call = True`: every session makes exactly one model call, first thing (completion.py).
    # The synchronous run then gathers a step's calls into one engine batch (orchestrator.run_groups).

    def reset(self, task: Any, workdir: Path, sample: int = 0) -> EnvSession: ...


class ServerFailure(RuntimeError):
    """The rollout server failed: the run stops (this is not an environment crash to average over)."""


class RewardUnavailable(RuntimeError):
    """No session of a step could be scored (each was UNSCORED: its reward's checker could not run, e.g. a
    command that is not installed): the reward itself is broken, and training on nothing would look like a run
    that worked. The run stops with the checker's error. (Moved from finetune/grpo.py.)"""


def task_name(task: Any) -> str:
    for attr in ("task_id", "instance_id", "name"):
        value = getattr(task, attr, None)
        if isinstance(value, str) and value:
            return value
    return str(task)
