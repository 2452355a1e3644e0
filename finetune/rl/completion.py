"""The single-turn environment (`glm5 finetune rl --env completion`): one completion of a task's prompt, scored
by the task's reward function. The RL on it is the one RL of this package (run_rl, synchronous, on the trained
model: finetune/grpo.py's train_grpo wires it).

    env = CompletionEnv(tokenizer)
    session = env.reset(RLTask(prompt_ids, score), workdir, sample)
    session.run(model)        # model.complete(prompt_ids): one call on the raw ids (no chat format)
    session.grade()           # Grade(score(text)); UNSCORED when score gave None (its checker could not run)

The text scored is what a user would read: the sampled ids decoded without special tokens (the end-of-turn
token a completion stops on left out). A reward of None is today's "left out of its group" (UNSCORED: no
advantage, the group kept), never a crash; a step where no completion could be scored stops the run with the
checker's error (run.py, env.RewardUnavailable). Each session makes exactly one call, first thing
(`single_call`), so a synchronous step's calls reach the engine as one batch in session order: the rollouts do
not depend on thread timing and a resumed run is the interrupted one.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from finetune.rl.rollout import UNSCORED, Grade


@dataclass
class RLTask:
    """A prompt (token ids, as they are sampled from) and its reward: completion text -> reward, or None when
    the checker itself failed (a `last_error` attribute on `score` says why, shown if a whole step fails)."""

    prompt_ids: list[int]
    score: Callable[[str], float | None]
    name: str = ""


class CompletionSession:
    def __init__(self, env: CompletionEnv, task: RLTask):
        self.env, self.task = env, task
        self.text: str | None = None

    def run(self, model) -> None:
        ids = model.complete(self.task.prompt_ids, self.env.seed_of(model.seed, model.session))
        self.text = self.env.tok.decode(ids, skip_special_tokens=True)

    def grade(self) -> Grade:
        with self.env.graders:  # a reward may run a test suite in a subprocess: as many at once as there are cores
            reward = self.task.score(self.text or "")
        if reward is None:  # why, where the checker said (run.py shows it when a whole step is unscored)
            return Grade(None, None, UNSCORED, getattr(self.task.score, "last_error", None) or "")
        return Grade(float(reward))

    def close(self) -> None:
        pass


class CompletionEnv:
    name = "completion"
    single_call = True

    def __init__(self, tokenizer, groups_per_step: int = 1):
        self.tok, self.per_step = tokenizer, groups_per_step
        self.graders = threading.BoundedSemaphore(os.cpu_count() or 1)

    def seed_of(self, seed: int, session: str) -> int:
        """The sampling seed of session "g{group}-s{i}" (the orchestrator's name): hash((seed, step, g, i)),
        g the group's place in its step, as finetune/grpo.py's own loop seeded it, so the completion run samples
        what it sampled before it ran on run_rl (Python's hash of a tuple of ints is the same in every process)."""
        group, i = (int(x) for x in re.fullmatch(r"g(\d+)-s(\d+)", session).groups())
        step, g = divmod(group, self.per_step)
        return hash((seed, step, g, i)) & 0x7FFFFFFF

    def reset(self, task: RLTask, workdir: Path, sample: int = 0) -> CompletionSession:
        return CompletionSession(self, task)
