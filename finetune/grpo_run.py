"""The recipe of `glm5 finetune rl --env completion`: GRPO + IcePop on single completions of a tasks file whose
rewards can be checked (moved from glm5cli/rl_cmd.py's _completion and _rl_tasks).

    cfg = completion_config(steps=100, prompts_per_step=4, group_size=8, ...)     # the CLI's options -> RLConfig
    summary = run_completion_rl(CompletionJob(model, out, tasks_file, cfg, reward=...), reporter)

The tasks file is read once (each row's reward checked against the registered reward types before anything
trains) and kept in the run folder -> the model in fp32 with LoRA on RL_TARGETS -> grpo.train_grpo (the one RL,
finetune/rl's run_rl with the completion env), resumable from the run folder's state.pt (run_rl's state with
the step) -> rl_log.jsonl (grpo.StepStats rows) and the adapter -> OUT.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from agent.plugin_registry import default_manager
from finetune import grpo
from finetune.artifacts import write_adapter, write_atomic
from finetune.errors import RunError, UsageError
from finetune.loading import checkpoint_tokenizer, load_for_training, prompt_rows
from finetune.lora import LoraSettings, add_lora
from finetune.recipe import Reporter, Run
from finetune.resume_state import check_completion_state
from finetune.rl.config import RLConfig
from finetune.rl.rewards import data_spec_problem


@dataclass(frozen=True)
class CompletionJob:
    """`glm5 finetune rl --env completion`'s options, parsed (see its --help for each)."""

    model: Path
    out: Path
    tasks_file: Path
    cfg: RLConfig
    reward: str | None = None
    rank: int = 16
    alpha: int = 32
    save_every: int = 10
    merge: bool = False


def completion_config(prompts_per_step: int = 4, **kw) -> RLConfig:
    """`--env completion`'s options (`steps`, `prompts_per_step`, `group_size`, `max_new_tokens`, `temperature`,
    `lr`, `updates_per_batch`, `seed`) -> the run's RLConfig: synchronous (IcePop on-policy), one completion per
    session, every completion of a step at once; a bad value as a UsageError."""
    try:
        size = kw.get("group_size", RLConfig.group_size)
        return RLConfig(groups_per_step=prompts_per_step, max_turns=1, sync=True, concurrency=prompts_per_step * size,
                        **kw)  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None


def rl_tasks(path: Path, tokenizer, default_reward: dict | None, makers: dict) -> list[dict]:
    """The tasks file -> [{"ids", "reward", "name"}]; a bad line or reward is a UsageError naming FILE:LINE.
    `makers`: the registered rewards by type."""
    tasks = []
    for ids, row, where in prompt_rows(path, tokenizer):
        spec = row.get("reward", default_reward)
        if spec is None:
            raise UsageError(f'{where}: no "reward" (and no --reward default)')
        problem = data_spec_problem(spec, default_reward) if "reward" in row else None
        if problem:  # the row is data: it may narrow what --reward chose, never widen it
            raise UsageError(f"{where}: {problem}")
        if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
            raise UsageError(f'{where}: "reward" must be an object with a "type" (one of: {", ".join(makers)})')
        if spec["type"] not in makers:
            raise UsageError(f"{where}: unknown reward type {spec['type']!r} (known: {', '.join(makers)})")
        try:
            makers[spec["type"]](spec)  # checked now, before any training
        except ValueError as e:
            raise UsageError(f"{where}: bad reward: {e}") from None
        tasks.append({"ids": ids, "reward": spec, "name": str(row.get("name", where))})
    return tasks


def run_completion_rl(job: CompletionJob, reporter: Reporter) -> dict:
    """GRPO on job.tasks_file, OUT written -> the summary."""
    tok = checkpoint_tokenizer(job.model)
    default_reward = None
    if job.reward is not None:
        try:
            default_reward = json.loads(job.reward)
        except json.JSONDecodeError as e:
            raise UsageError(f"--reward is not JSON: {e.msg}") from None
    cfg = job.cfg
    settings = {"model": str(job.model.resolve()), "tasks": str(job.tasks_file.resolve()), "reward": default_reward}
    settings |= {"steps": cfg.steps, "config": dataclasses.asdict(cfg), "rank": job.rank, "alpha": job.alpha,
                 "merge": job.merge}  # fmt: skip
    run = Run(job.out, settings, reporter=reporter)
    makers = default_manager().rewards()
    saved = run.saved_sequences()
    rows = saved["tasks"] if saved is not None else rl_tasks(job.tasks_file, tok, default_reward, makers)
    tasks = [grpo.RLTask(t["ids"], makers[t["reward"]["type"]](t["reward"]), t["name"]) for t in rows]
    t0 = time.monotonic()
    net = load_for_training(job.model, "train the full-precision checkpoint, then quantize the result", reporter.status)
    net = add_lora(net, LoraSettings(rank=job.rank, alpha=job.alpha, targets=grpo.RL_TARGETS), seed=cfg.seed)
    state = run.start({"tasks": rows}, check=check_completion_state)
    with reporter.steps() as bar:
        task = bar.add_task("RL (GRPO)", total=cfg.steps, completed=state["step"] if state else 0)

        def log(st) -> None:
            bar.update(task, advance=1, description=f"RL (GRPO), reward {st.reward_mean:.3f}, KL "
                       f"{st.kl_rollout:.2g}, |g| {st.pg_grad_norm:.2g}")  # fmt: skip

        try:  # looked up on the module at each run: tests wrap grpo.train_grpo
            hist = grpo.train_grpo(net, tasks, cfg, tokenizer=tok, log=log, resume=state, save=run.save,
                                   save_every=job.save_every)  # fmt: skip
        except grpo.RewardUnavailable as e:
            raise RunError(str(e), "fix the reward (run its command by hand) and rerun; nothing was written to OUT") from e
    write_atomic(run.work / "rl_log.jsonl", "".join(json.dumps(h.as_dict()) + "\n" for h in hist))
    write_adapter(job.model, net, run.work, job.merge, status=reporter.status)
    summary = _summary(job, hist, len(tasks), t0)
    run.finish()
    return summary


def _summary(job: CompletionJob, hist: list, n_tasks: int, t0: float) -> dict:
    # Two windows that never overlap: the first and last k steps, k = min(5, steps // 2) (one step: itself).
    k = max(1, min(5, len(hist) // 2))
    cfg = job.cfg
    return {
        "out": str(job.out),
        "adapter": str(job.out / "adapter"),
        "merged_checkpoint": str(job.out) if job.merge else None,
        "tasks": n_tasks,
        "steps": cfg.steps,
        "completions": cfg.steps * cfg.groups_per_step * cfg.group_size,
        "window": k,
        "reward_first": round(sum(h.reward_mean for h in hist[:k]) / k, 4),
        "reward_last": round(sum(h.reward_mean for h in hist[-k:]) / k, 4) if len(hist) > 1 else None,
        "kl_rollout_last": round(hist[-1].kl_rollout, 6),
        "pg_grad_norm_mean": round(sum(h.pg_grad_norm for h in hist) / len(hist), 6),
        "failed_checks": sum(h.failed for h in hist),
        "steps_without_signal": sum(1 for h in hist if h.groups_with_signal == 0),
        "icepop_masked": round(sum(h.icepop_masked for h in hist) / len(hist), 6),
        "seconds": round(time.monotonic() - t0, 1),
    }
