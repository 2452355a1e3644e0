"""Held-out evaluation during an RL run: the policy the rollout server serves, on tasks it never trains on, graded
by the same environment (for `--env swe|terminal` the bench's trials and grading, so "solved" is the bench's).

`HeldOut(env, tasks, samples)` runs each held-out task `samples` times through an Orchestrator of its own on the
run's rollout server (the in-process engine or `--rollout-url` servers, after the weight push: exactly the pushed
policy), with fixed session seeds, so two evaluations differ only by the weights. It returns the eval_* fields of
an rl_log.jsonl row. The training sessions of an asynchronous run keep going meanwhile on the same server; the
trainer waits (it is the trainer's thread that evaluates), so the version cannot move during an evaluation.

This is a cheap in-run signal; the learning curve of record is `glm5 bench` on the saved step adapters
(`--save-every`), which samples as the bench does. `disjoint` refuses held-out tasks that are also training tasks.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from finetune.rl.config import RLConfig
from finetune.rl.orchestrator import Orchestrator
from finetune.rl.rollout import Rollout

EVAL_SEED = 1_000_003  # its own seeds: the held-out sessions never replay a training session's samples


def task_id(task) -> str:
    for attr in ("instance_id", "name"):
        if isinstance(getattr(task, attr, None), str):
            return getattr(task, attr)
    return repr(task)


def disjoint(train: list, held_out: list) -> None:
    """Raise ValueError naming the held-out tasks that are also training tasks."""
    both = sorted({task_id(t) for t in train} & {task_id(t) for t in held_out})
    if both:
        shown = ", ".join(both[:5]) + (f" and {len(both) - 5} more" if len(both) > 5 else "")
        raise ValueError(f"{len(both)} held-out task(s) are also training tasks: {shown}")


class HeldOut:
    def __init__(self, env, tasks: list, samples: int, tokenizer, cfg: RLConfig, workdir: Path, max_model_len=None):
        if not tasks:
            raise ValueError("no held-out tasks")
        if samples < 2:
            raise ValueError("held-out samples must be >= 2 (sessions per task, a group of the orchestrator)")
        self.env, self.tasks, self.tok, self.workdir = env, tasks, tokenizer, Path(workdir)
        self.max_model_len = max_model_len
        # The run's sampling (temperature, token limits, turns), its own seeds, all of one task's samples at once.
        self.cfg = dataclasses.replace(cfg, group_size=samples, seed=EVAL_SEED, sync=True)

    def __call__(self, server, step: int) -> dict:
        got: list[Rollout] = []
        where = self.workdir / f"step-{step}"
        shutil.rmtree(where, ignore_errors=True)  # a resumed run evaluates a step again from scratch
        orch = Orchestrator(self.env, self.tasks, server, self.tok, self.cfg, where, got.append,
                            max_model_len=self.max_model_len)  # fmt: skip
        try:
            orch.run_groups(orch.next_ids(len(self.tasks)))  # the first epoch of the task order: each task once
        finally:
            orch.close()
            shutil.rmtree(where, ignore_errors=True)
        valid = [r for r in got if r.valid]
        per_task: dict[str, list[bool]] = {}
        for r in valid:
            per_task.setdefault(task_id(self.tasks[r.task]), []).append(bool(r.solved))
        return {
            "eval_step": step,
            "eval_solved_rate": sum(bool(r.solved) for r in valid) / len(valid) if valid else None,
            "eval_reward_mean": sum(r.reward for r in valid) / len(valid) if valid else None,
            "eval_sessions": len(valid),
            "eval_env_errors": len(got) - len(valid),
            "eval_solved_by_task": {k: sum(v) / len(v) for k, v in sorted(per_task.items())},
            "eval_versions": sorted({c.version_start for r in got for c in r.calls}),  # the policy measured
        }
