"""One RL run: the roles wired together, synchronously or asynchronously, resumable from its folder.

    orchestrator (sessions -> rollouts) -> buffer (staleness, crash groups) -> trainer (one optimizer step)
    -> weight push (the server's version moves) -> checkpoint -> rl_log.jsonl row

- `sync=True`: each step runs its groups (sessions in parallel), waits for all of them, trains, pushes. The
  engine serves the trainer's model itself (no copy); nothing samples while the trainer steps.
- `sync=False`: the orchestrator's feeder runs sessions in the background the whole time, gated so that no
  group starts that would be more than tau versions stale when trained; the trainer takes the next complete
  groups as soon as there are enough. The engine serves its own copy, updated in place at each push. With
  tau = 0 the gate admits exactly the synchronous schedule, and the run gives the synchronous result.

The run folder WORK holds state.pt (trainer: version, trained tensors, optimizer; consumed and dropped groups;
the log so far), written whole after each optimizer step, and rollouts/ (the buffer). Killed at any moment, a
rerun continues from the last optimizer step with the finished rollouts it had buffered, judging their
staleness against the restored version; sessions that were in flight run again with the same seeds.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from finetune.resume_state import check_rl_state, load_state
from finetune.rl.buffer import RolloutBuffer, TakeReport
from finetune.rl.config import RLConfig
from finetune.rl.env import RewardUnavailable
from finetune.rl.orchestrator import Orchestrator
from finetune.rl.rollout import UNSCORED
from finetune.rl.server import InProcessServer
from finetune.rl.sharded import ShardedTrainer
from finetune.rl.trainer import Trainer
from finetune.rl.weight_push import WeightPush


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def step_row(step: int, version: int, groups, rep: TakeReport, train: dict, extra: dict) -> dict:
    """One rl_log.jsonl row: rewards over the distinct valid sessions of the kept groups (padding left out)."""
    seen = {(r.group, r.index): r for g in groups for r in g}.values()
    rewards = [r.reward for r in seen if r.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    solved = [r.solved for r in seen if r.solved is not None]
    row = {
        "step": step,
        "version": version,
        "reward_mean": mean,
        "reward_std": math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)) if rewards else 0.0,
        "solved_rate": sum(solved) / len(solved) if solved else None,
        "sessions": len(seen),
        "sampled_tokens": sum(r.sampled_tokens for r in seen),
    }
    unscored = sum(r.status == UNSCORED for r in seen)
    if unscored:  # sessions whose reward's checker could not run (left out of their groups)
        row["unscored_sessions"] = unscored
    if rep.uniform:  # dynamic sampling: what the step drew, the no-signal groups it dropped included
        drawn = [*seen, *rep.uniform]
        row["drawn_reward_mean"] = sum(r.reward or 0.0 for r in drawn) / len(drawn)
        done = [r.solved for r in drawn if r.solved is not None]
        row["drawn_solved_rate"] = sum(done) / len(done) if done else None
        row["drawn_sessions"] = len(drawn)
    row |= {
        "groups_kept": len(rep.kept),
        "groups_dropped": len(rep.dropped),
        "dropped_by_reason": rep.dropped_by_reason(),
        "dropped_groups": {str(g): why for g, why in rep.dropped.items()},
        "padded_samples": rep.padded,
        "stale_samples": rep.stale_samples,
        "crashed_samples": rep.crashed_samples,
        "staleness_hist": {str(k): v for k, v in sorted(rep.lags.items())},
        "model_calls": sum(len(r.calls) for r in seen),
        "refused_calls": sum(c.refused for r in seen for c in r.calls),  # a tool answered `error: ...`
        **train,
        **extra,
    }
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}


def _check_scored(step: int, groups: list) -> None:
    """RewardUnavailable when no session of the step's groups got a reward (each UNSCORED: its checker could
    not run), with the checker's error where it gave one: training on nothing would look like a run that worked."""
    seen = {(r.group, r.index): r for g in groups for r in g}.values()
    if not seen or any(r.reward is not None for r in seen):
        return
    errors = sorted({r.error for r in seen if r.error})
    raise RewardUnavailable(f"step {step + 1}: no completion could be scored (the reward returned None for all "
                            f"{len(seen)})" + (f": {errors[0]}" if errors else ""))  # fmt: skip


class _Progress:
    """What state.pt keeps besides the trainer: the log rows so far, the groups consumed and dropped, the
    evaluations by step (0: before training), and how many rows `log` was handed (a kill between a step's save
    and its log leaves one behind)."""

    def __init__(self, state: dict | None = None):
        state = state or {}
        self.history: list[dict] = state.get("history", [])
        self.consumed: set[int] = set(state.get("consumed", ()))
        self.dropped: set[int] = set(state.get("dropped", ()))
        self.evals: dict[int, dict] = dict(state.get("evals", {}))
        self.logged: int = state.get("logged", len(self.history))

    def has_group(self, g: int) -> bool:
        """Whether group `g` was trained or dropped already (the orchestrator skips it)."""
        return g in self.consumed or g in self.dropped

    def fields(self) -> dict:
        return {"history": self.history, "consumed": sorted(self.consumed), "dropped": sorted(self.dropped),
                "evals": self.evals, "logged": self.logged}  # fmt: skip


def _load_checked(state_path: Path) -> dict | None:
    """The folder's state.pt, or None: a folder someone else may have left, so loaded without running code and
    checked."""
    if not state_path.is_file():
        return None
    return check_rl_state(load_state(state_path), state_path)


class _StepLoop:
    """The step loop of one run and the bookkeeping its steps share: the staleness gate, dropped groups, the
    evaluations, state.pt and the log rows."""

    def __init__(self, cfg: RLConfig, trainer: Trainer, progress: _Progress, state_path: Path,
                 buffer: RolloutBuffer, server, pusher: WeightPush, orch: Orchestrator,
                 evaluate: Callable[[object, int], dict] | None, eval_every: int,
                 log: Callable[[dict], None] | None):  # fmt: skip
        self.cfg, self.trainer, self.progress, self.state_path = cfg, trainer, progress, state_path
        self.buffer, self.server, self.pusher, self.orch = buffer, server, pusher, orch
        self.evaluate, self.eval_every, self.log = evaluate, eval_every, log
        self.n_prior = len(progress.consumed)
        self.n_dropped = 0
        self.pushed = trainer.version  # the version the server serves (the trainer's is ahead until the push lands)

    def live(self) -> int:
        return self.orch.started + self.n_prior - self.n_dropped

    def gate(self, _g: int) -> bool:
        # AReaL's staleness bound, and never more groups than the run has steps for: a group started past the
        # last step would be cut off unfinished, its sessions' compute taken from the ones that are trained.
        return self.live() < min(self.pushed + self.cfg.staleness + 1, self.cfg.steps) * self.cfg.groups_per_step

    def on_dropped(self, rep: TakeReport, seen: set) -> None:
        new = [g for g in rep.dropped if g not in seen]
        seen.update(new)
        self.n_dropped += len(new)

    def save(self) -> None:
        _save(self.state_path, {"trainer": self.trainer.state(), **self.progress.fields()})

    def due(self, k: int) -> bool:
        every = k == 0 or k == self.cfg.steps or (self.eval_every > 0 and k % self.eval_every == 0)
        return self.evaluate is not None and k not in self.progress.evals and every

    def run_eval(self, k: int) -> dict:
        t0 = time.monotonic()
        ev = {n: (round(v, 6) if isinstance(v, float) else v) for n, v in self.evaluate(self.server, k).items()}
        self.progress.evals[k] = {**ev, "eval_s": round(time.monotonic() - t0, 3)}
        self.save()
        return self.progress.evals[k]

    def finish(self, row: dict) -> bool:
        """A step after its push: its evaluation (when due) joins its row, then `log` gets the row. -> whether
        an evaluation ran. A resumed run finishes a step that was saved but never logged the same way."""
        k, ran = row["step"], False
        if k in self.progress.evals:
            row.update(self.progress.evals[k])  # evaluated before a kill, not yet in the row
        elif self.due(k):
            row.update(self.run_eval(k))
            ran = True
        if self.log is not None:
            self.log(row)
        self.progress.logged = max(self.progress.logged, k)  # row k is history[k - 1]
        self.save()
        return ran

    def mark(self) -> dict:  # where the next row's throughput and idle figures start (evaluations left out)
        st = self.server.stats()
        return {"gen": st["generated_tokens"], "idle": st["idle_s"], "t": time.monotonic()}

    def wait(self, rep: TakeReport, seen_drops: set) -> None:
        """While the buffer has too few complete groups: sync, run the groups the step lacks; async, let the
        feeder work (a drop frees the gate)."""
        self.on_dropped(rep, seen_drops)
        if self.cfg.sync:
            n = (self.trainer.version + 1) * self.cfg.groups_per_step - self.live()
            self.orch.run_groups(self.orch.next_ids(max(n, 1)))
        else:
            self.orch.check()
            with self.buffer.changed:
                self.buffer.changed.notify_all()  # a drop frees the gate
                self.buffer.changed.wait(0.2)

    def run(self, resumed_rollouts: int) -> None:
        """Every step left: the evaluation before the first, a step saved but never logged finished, then
        take -> train -> save -> push -> finish, step by step."""
        start = self.trainer.version
        if start == 0 and self.due(0):  # before the first step
            self.run_eval(0)
        for row in self.progress.history[self.progress.logged :]:  # killed after a step's save, before its log
            self.finish(row)
        if not self.cfg.sync:
            self.orch.start(self.gate, self.buffer.changed)
        prev = self.mark()
        for step in range(start, self.cfg.steps):
            prev = self.step(step, resumed_rollouts if step == start else 0, prev)

    def step(self, step: int, resumed_rollouts: int, prev: dict) -> dict:
        """One optimizer step, from waiting for its groups to its finished row. -> the next row's start mark."""
        t_wait = time.monotonic()
        seen_drops: set = set()
        B = self.cfg.groups_per_step
        wait = functools.partial(self.wait, seen_drops=seen_drops)
        groups, rep = self.buffer.take(self.trainer.version, B, wait, filter_uniform=self.cfg.dynamic_sampling * B)
        self.on_dropped(rep, seen_drops)
        _check_scored(step, groups)
        trainer_idle = time.monotonic() - t_wait
        train = self.trainer.step(groups)
        self.progress.consumed.update(rep.kept)
        self.progress.dropped.update(rep.dropped)
        now, st = time.monotonic(), self.server.stats()
        extra = {
            "rollout_tokens_per_s": (st["generated_tokens"] - prev["gen"]) / max(1e-9, now - prev["t"]),
            "server_idle_s": st["idle_s"] - prev["idle"],
            "trainer_idle_s": trainer_idle,
            "resumed_rollouts": resumed_rollouts,
            "seconds": now - prev["t"],
        }
        prev = {"gen": st["generated_tokens"], "idle": st["idle_s"], "t": now}
        row = step_row(step + 1, self.trainer.version, groups, rep, train, extra)
        if row["step"] == 1 and 0 in self.progress.evals:
            row["eval_before"] = self.progress.evals[0]
        self.progress.history.append(row)
        self.save()
        self.buffer.forget(rep.kept)
        if self.cfg.reset_optimizer:
            self.trainer.reset_optimizer()
        version = self.pusher.push(self.trainer.version)
        with self.buffer.changed:
            self.pushed = version
            self.buffer.changed.notify_all()  # the gate opens for the next version's groups
        return self.mark() if self.finish(row) else prev


def run_rl(
    model,
    tokenizer,
    env,
    tasks: list,
    cfg: RLConfig,
    work: Path,
    server=None,
    max_model_len: int = 4096,
    log: Callable[[dict], None] | None = None,
    push_dir: Path | None = None,
    evaluate: Callable[[object, int], dict] | None = None,
    eval_every: int = 0,
    trainer: Trainer | ShardedTrainer | None = None,
) -> list[dict]:
    """Train `model`'s trainable parameters (LoRA's after `add_lora`) on sessions in `env` -> the log rows.
    `server`: a RolloutServer (default: an in-process engine). Reruns with the same WORK resume.
    `evaluate(server, step) -> {eval_...}` (evaluate.HeldOut): run before the first step and after the push of
    every `eval_every`-th step and the last one, on the server's pushed weights; its fields join that step's row
    (the step-0 result is the first row's `eval_before`). `trainer`: rank 0's ShardedTrainer of a torchrun run
    (finetune/rl/sharded.py: the other ranks follow it; sampling needs a `server`); default a Trainer of `model`."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    sharded = isinstance(trainer, ShardedTrainer)
    if sharded and server is None:
        raise ValueError("a policy sharded over torchrun's ranks samples through a rollout server: give `server`")
    trainer = trainer or Trainer(model, cfg)
    state_path = work / "state.pt"
    state = _load_checked(state_path)
    progress = _Progress(state)
    if state is not None:
        trainer.restore(state["trainer"])
    buffer = RolloutBuffer(work / "rollouts", cfg.group_size, cfg.staleness)
    resumed_rollouts = buffer.load(progress.consumed | progress.dropped)
    own_server = server is None
    if own_server:
        served = model if cfg.sync else copy.deepcopy(model)
        server = InProcessServer(served, tokenizer, max_model_len, cfg.concurrency, cfg.seed)
    pusher = WeightPush(server, model, shared=own_server and cfg.sync, push_dir=push_dir or work / "pushes",
                        adapter_state=trainer.adapter_state if sharded else None)  # fmt: skip
    if state is not None or not own_server:
        pusher.push(trainer.version)  # the server serves the restored weights, at the restored version
    orch = Orchestrator(env, tasks, server, tokenizer, cfg, work / "sessions", buffer.add, skip=buffer.has,
                        skip_group=progress.has_group, max_model_len=max_model_len)  # fmt: skip
    run = _StepLoop(cfg, trainer, progress, state_path, buffer, server, pusher, orch, evaluate, eval_every, log)
    try:
        run.run(resumed_rollouts)
    finally:
        orch.close()
        if own_server:
            server.close()
    if sharded:  # finished: the other ranks leave `follow` (after an error torchrun stops them)
        trainer.stop()
    return progress.history


def summary(history: list[dict]) -> dict:
    """First and last parts of the run, never overlapping: the first and last k = min(5, n // 2) steps (one
    step: that step alone, with nothing to compare)."""
    n = len(history)
    if n == 0:
        return {}
    k = max(1, min(5, n // 2))

    def mean(rows, key):  # with dynamic sampling, over what each step drew (its no-signal groups included)
        vals = [r.get(f"drawn_{key}", r.get(key)) for r in rows]
        vals = [v for v in vals if v is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    out = {"steps": n, "window": k, "reward_first": mean(history[:k], "reward_mean")}
    out["reward_last"] = mean(history[-k:], "reward_mean") if n > 1 else None
    out["solved_first"] = mean(history[:k], "solved_rate")
    out["solved_last"] = mean(history[-k:], "solved_rate") if n > 1 else None
    out["groups_dropped"] = sum(r["groups_dropped"] for r in history)
    out["groups_no_signal"] = sum(r.get("dropped_by_reason", {}).get("no_signal", 0) for r in history)
    out["is_masked"] = mean(history, "is_masked")
    return out
