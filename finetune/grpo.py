"""RL on single completions with GRPO + IcePop, GLM-5's reasoning-RL objective (reference: finetuning-rl.md §1.2,
Eq. 1): the completion env of the one RL (finetune/rl), on-policy, with rollouts from the embedded engine serving
the very model being trained.

    model = add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(targets=RL_TARGETS))
    tasks = [RLTask(prompt_ids, score), ...]            # score(completion text) -> reward, or None
    train_grpo(model, tasks, RLConfig(steps=100), tokenizer=tok)

What runs is finetune/rl's: run_rl, synchronous, with rl/completion.py's CompletionEnv (each session one
completion of its task's prompt, scored by the task's reward) and an InProcessServer on the trained model, so
the rollouts are on-policy; each step takes `groups_per_step` tasks (orchestrator.task_order) and `group_size`
completions of each, then rl/trainer.py's Trainer takes the step (objective.py):

    A_i     = (R_i - mean(R)) / (std(R) + 1e-6)              group-normalised advantage (no KL term)
    rho     = pi_train_old / pi_infer                        train/inference mismatch (same weights)
    pop     = rho if 1/beta <= rho <= beta else 0            IcePop: mismatched tokens are dropped
    q       = pi_train / pi_train_old                        1 at the first update, with gradient
    loss    = -(1/G) sum_i 1/|y_i| sum_t pop * min(q A_i, clip(q, 1 - eps_low, 1 + eps_high) A_i)
              averaged over the step's groups

beta = 2 (icepop_beta), eps_low = 0.2, eps_high = 0.28 (RLConfig's is_low / is_high) are GLM-5's; the log-
probabilities use the sampling temperature, as the engine's do. `updates_per_batch` > 1 reuses a batch for
several optimizer steps, where the clip matters; `warmup` ramps the learning rate. A completion whose reward is
None (the checker itself failed) is left out of its group; a group with fewer than two scored completions, or
whose rewards are all equal, has no signal and adds nothing (it is counted). A step in which no completion could
be scored stops the run (`RewardUnavailable`, with the checker's error where it gave one).

The indexer is never trained (GLM-5 §3.2 freezes it in RL; LoRA does not target it), and `RL_TARGETS` leaves
out kv_b_proj: the engine's absorbed attention reads kv_b_proj's dense weight, which a LoRA wrapper would
bypass in the rollouts. Runs are exactly resumable: sampling seeds come from (seed, group, sample), the task
order from (seed, epoch), and a step's completions are sampled as one batch in session order.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from finetune.resume_state import load_state
from finetune.rl.completion import CompletionEnv, RLTask
from finetune.rl.config import RLConfig
from finetune.rl.env import RewardUnavailable
from finetune.rl.objective import advantages
from finetune.rl.orchestrator import task_order
from finetune.rl.run import run_rl
from finetune.sft import DEFAULT_TARGETS

RL_TARGETS = tuple(t for t in DEFAULT_TARGETS if t != "kv_b_proj")

# what this module offers besides train_grpo: the names its users import from here
__all__ = ["RL_TARGETS", "RLTask", "RewardUnavailable", "StepStats", "advantages", "task_order", "train_grpo"]


@dataclass
class StepStats:
    """One step of a completion run, as its rl_log.jsonl row (a run_rl row's deterministic fields, by their
    GRPO names: a resumed run's log is the interrupted run's, byte for byte)."""

    step: int
    reward_mean: float
    reward_std: float
    groups_with_signal: int
    groups: int
    failed: int  # completions whose checker failed (left out)
    # What moves (the surrogate's value is 0 by construction on-policy, its gradient is not): the policy
    # gradient's norm before clipping, and KL(pi_rollout || pi_train) by the k3 estimator r - 1 - log r.
    pg_grad_norm: float
    kl_rollout: float
    icepop_masked: float  # fraction of tokens IcePop dropped
    mismatch: float  # mean |log pi_train - log pi_infer| over the tokens: the train/serve logprob gap
    clipped: float  # fraction of tokens whose ratio was clipped (only with updates_per_batch > 1)
    completion_tokens: float  # mean completion length

    @classmethod
    def from_row(cls, row: dict) -> StepStats:
        return cls(
            step=row["step"],
            reward_mean=row["reward_mean"],
            reward_std=row["reward_std"],
            groups_with_signal=row["groups_with_signal"],
            groups=row["groups_kept"],
            failed=row.get("unscored_sessions", 0),
            pg_grad_norm=row["pg_grad_norm"],
            kl_rollout=row["kl_rollout"],
            icepop_masked=row["is_masked"],
            mismatch=row["mismatch"],
            clipped=row.get("clipped", 0.0),
            completion_tokens=row["sampled_tokens"] / max(1, row["sessions"]),
        )

    def as_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def train_grpo(
    model,
    tasks: list[RLTask],
    cfg: RLConfig,
    tokenizer=None,
    log: Callable[[StepStats], None] | None = None,
    resume: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
) -> list[StepStats]:
    """The completion RL (module docstring) -> a StepStats per step. Trains the parameters that require grad
    (LoRA's, after `add_lora`). `cfg` runs synchronously with every completion of a step at once (its `sync` and
    `concurrency` are set so). Checkpoints: `save(state)` every `save_every` steps (run_rl's state with the
    step: trainer, log rows, groups consumed); `resume=state` continues from one, and the resumed run is the
    interrupted one (same tasks, same sampling seeds, same batches)."""
    if not tasks:
        raise ValueError("no tasks")
    cfg = dataclasses.replace(cfg, sync=True, concurrency=cfg.groups_per_step * cfg.group_size)
    longest = max(len(t.prompt_ids) for t in tasks) + cfg.max_new_tokens
    with tempfile.TemporaryDirectory(prefix="glm5-grpo-") as tmp:
        work = Path(tmp)
        if resume is not None:
            torch.save({k: v for k, v in resume.items() if k != "step"}, work / "state.pt")

        def each(row: dict) -> None:
            if log is not None:
                log(StepStats.from_row(row))
            k = row["step"]
            if save is not None and save_every and k % save_every == 0 and k < cfg.steps:
                # state.pt holds step k (written before its row was handed here); as of now the row is logged
                save({"step": k, **load_state(work / "state.pt"), "logged": k})

        env = CompletionEnv(tokenizer, cfg.groups_per_step)
        rows = run_rl(model, tokenizer, env, tasks, cfg, work, max_model_len=longest + 1, log=each)
        if save is not None:
            save({"step": cfg.steps, **load_state(work / "state.pt")})
    return [StepStats.from_row(r) for r in rows]
