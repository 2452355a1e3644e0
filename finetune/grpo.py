"""RL with GRPO + IcePop, GLM-5's reasoning-RL objective (reference: finetuning-rl.md §1.2, Eq. 1), on-policy,
with rollouts from the embedded engine serving the very model being trained.

    model = add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(targets=RL_TARGETS))
    tasks = [RLTask(prompt_ids, score), ...]            # score(completion text) -> reward, or None
    train_grpo(model, tasks, GRPOConfig(steps=100), tokenizer=tok)

Each step takes `prompts_per_step` tasks and samples `group_size` completions of each from an LLMEngine on the
same model (its weights are the trainer's, so the rollouts are on-policy). The engine returns each sampled
token's logprob under the distribution it sampled from (pi_infer). Then, per token of completion i of a group:

    A_i     = (R_i - mean(R)) / (std(R) + 1e-6)              group-normalised advantage (no KL term)
    rho     = pi_train_old / pi_infer                        train/inference mismatch (same weights)
    pop     = rho if 1/beta <= rho <= beta else 0            IcePop: mismatched tokens are dropped
    r       = pi_train / pi_train_old                        1 at the first update, with gradient
    loss    = -(1/G) sum_i 1/|y_i| sum_t pop * min(r A_i, clip(r, 1 - eps_low, 1 + eps_high) A_i)
              averaged over the step's groups

A_i, the tasks of a step and log pi_train are the agentic RL's own (finetune/rl: objective.advantages,
orchestrator.task_order, objective.token_logprobs on each completion as a TokenSample).
beta = 2, eps_low = 0.2, eps_high = 0.28 are GLM-5's. The log-probabilities use the sampling temperature, as the
engine's do. A completion whose reward is None (the checker itself failed) is left out of its group; a group
with fewer than two scored completions, or whose rewards are all equal, has no signal and adds nothing (it is
counted). A step in which no completion could be scored stops the run (`RewardUnavailable`, with the checker's
error where it gave one): training on nothing would look like a run that worked. `updates_per_batch` > 1 reuses a batch for several optimizer steps, where the clip matters.

The indexer is never trained (GLM-5 §3.2 freezes it in RL; LoRA does not target it), and `RL_TARGETS` leaves
out kv_b_proj: the engine's absorbed attention reads kv_b_proj's dense weight, which a LoRA wrapper would
bypass in the rollouts. Runs are exactly resumable: sampling seeds come from (seed, step, task, i) and the
task order from (seed, epoch).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import torch

from finetune.rl.objective import advantages, token_logprobs
from finetune.rl.orchestrator import task_order
from finetune.rl.rollout import TokenSample
from finetune.sft import DEFAULT_TARGETS
from finetune.train_loop import restore_training_state, training_state

RL_TARGETS = tuple(t for t in DEFAULT_TARGETS if t != "kv_b_proj")


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 100
    prompts_per_step: int = 4
    group_size: int = 8
    max_new_tokens: int = 256
    temperature: float = 1.0
    lr: float = 1e-5
    warmup: int = 0
    updates_per_batch: int = 1
    icepop_beta: float = 2.0
    eps_low: float = 0.2
    eps_high: float = 0.28
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2: GRPO's advantage compares completions of one prompt")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0: RL samples (greedy rollouts have no spread to learn from)")
        if self.icepop_beta <= 1:
            raise ValueError("icepop_beta must be > 1 (the kept band is [1/beta, beta])")
        for name in ("steps", "prompts_per_step", "max_new_tokens", "updates_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass
class RLTask:
    prompt_ids: list[int]
    score: Callable[[str], float | None]  # completion text -> reward; None: the checker failed
    name: str = ""


@dataclass
class Rollout:
    """One sampled completion: its tokens, their logprobs under the sampling policy, its reward."""

    task: int
    prompt_ids: list[int]
    ids: list[int]
    infer_logprobs: list[float]
    reward: float | None
    text: str = ""


@dataclass
class StepStats:
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

    def as_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


class RewardUnavailable(RuntimeError):
    """No completion of a step could be scored: the reward itself is broken (a command that cannot run)."""


def rollout(engine, tasks: list[RLTask], which: list[int], cfg: GRPOConfig, step: int, tokenizer=None):
    """`group_size` completions of each task in `which`, sampled by `engine` -> groups of Rollouts."""
    from serve.engine.sampling_params import SamplingParams

    reqs = {}
    for g, t in enumerate(which):
        for i in range(cfg.group_size):
            params = SamplingParams(
                temperature=cfg.temperature,
                max_tokens=cfg.max_new_tokens,
                seed=hash((cfg.seed, step, g, i)) & 0x7FFFFFFF,
            )
            rid = engine.add_request(list(tasks[t].prompt_ids), params, request_id=f"rl-{step}-{g}-{i}")
            reqs[rid] = (g, t)
    done = {}
    while engine.has_unfinished:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    groups: list[list[Rollout]] = [[] for _ in which]
    for rid, (g, t) in reqs.items():
        out = done[rid]
        if len(out.logprobs) != len(out.token_ids):
            raise RuntimeError(
                f"{rid}: the engine returned {len(out.logprobs)} logprobs for {len(out.token_ids)} tokens"
            )
        # What a user would read: special tokens (the end-of-turn token a completion stops on) left out.
        text = tokenizer.decode(out.token_ids, skip_special_tokens=True) if tokenizer is not None else out.text
        groups[g].append(
            Rollout(t, tasks[t].prompt_ids, list(out.token_ids), [lp.logprob for lp in out.logprobs], None, text)
        )
    # Scored in parallel: a reward may run a test suite in a subprocess (each scorer is independent, and the
    # rewards land in their completions whatever order the checks finish in).
    flat = [r for group in groups for r in group]
    with ThreadPoolExecutor(max_workers=min(len(flat), os.cpu_count() or 1)) as pool:
        for r, reward in zip(flat, pool.map(lambda r: tasks[r.task].score(r.text), flat), strict=True):
            r.reward = reward
    return groups


def _token_logprobs(model, rollouts: list[Rollout], temperature: float) -> list[torch.Tensor]:
    """log pi_train of each completion's tokens (with gradient), at the sampling temperature: the one RL's
    rl/objective.token_logprobs on each completion as a token sample (its prompt context, its completion
    sampled). The lm_head runs on the rows that predict completion tokens only."""
    samples = [
        TokenSample(r.prompt_ids + r.ids, [0] * len(r.prompt_ids) + [1] * len(r.ids),
                    [0.0] * len(r.prompt_ids) + list(r.infer_logprobs), version=0)  # fmt: skip
        for r in rollouts
    ]
    return token_logprobs(model, samples, temperature)


def grpo_backward(
    model, groups: list[list[Rollout]], cfg: GRPOConfig, old: list[torch.Tensor] | None = None, micro_batch: int = 8
):
    """GRPO + IcePop over the groups, back-propagated `micro_batch` completions at a time (gradients add up;
    memory stays that of one micro-batch) -> (loss value or None without signal, stats, the old logprobs to
    reuse for a further update on the same batch). The caller steps the optimizer."""
    batch, adv = [], []
    for group in groups:
        for r, a in zip(group, advantages([r.reward for r in group]), strict=True):
            if a is not None and a != 0.0 and r.ids:
                batch.append(r)
                adv.append(a)
    stats = {"icepop_masked": 0.0, "mismatch": 0.0, "clipped": 0.0, "kl_rollout": 0.0}
    if not batch:
        return None, stats, old
    scale = 1.0 / (cfg.group_size * len(groups))  # 1/G per group, averaged over the step's groups
    reused = old is not None
    old = list(old) if reused else []
    total = 0.0
    masked = clipped = n_tok = 0
    mismatch = kl = 0.0
    for i in range(0, len(batch), micro_batch):
        rows, coef = batch[i : i + micro_batch], adv[i : i + micro_batch]
        new = _token_logprobs(model, rows, cfg.temperature)
        if not reused:
            old.extend(x.detach() for x in new)
        loss = new[0].new_zeros(())
        for j, (r, a, lp) in enumerate(zip(rows, coef, new, strict=True)):
            lp_old = old[i + j]
            infer = torch.tensor(r.infer_logprobs, dtype=lp.dtype)
            rho = torch.exp(lp_old - infer)
            keep = (rho >= 1 / cfg.icepop_beta) & (rho <= cfg.icepop_beta)
            pop = torch.where(keep, rho, torch.zeros_like(rho))
            ratio = torch.exp(lp - lp_old)
            surrogate = torch.minimum(ratio * a, ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high) * a)
            loss = loss - (pop * surrogate).mean() * scale
            masked += int((~keep).sum())
            clipped += int(((ratio < 1 - cfg.eps_low) | (ratio > 1 + cfg.eps_high)).sum())
            mismatch += float((lp_old - infer).abs().sum())
            log_r = (lp.detach() - infer).double()
            kl += float((log_r.exp() - 1 - log_r).sum())
            n_tok += len(r.ids)
        loss.backward()
        total += float(loss.detach())
    stats = {"icepop_masked": masked / n_tok, "mismatch": mismatch / n_tok, "clipped": clipped / n_tok}
    stats["kl_rollout"] = kl / n_tok
    return total, stats, old


def train_grpo(
    model,
    tasks: list[RLTask],
    cfg: GRPOConfig,
    tokenizer=None,
    engine=None,
    log: Callable[[StepStats], None] | None = None,
    resume: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
) -> list[StepStats]:
    """The RL loop (module docstring). Trains the parameters that require grad (LoRA's, after `add_lora`).
    `engine`: an LLMEngine on `model` (one is made if None). Checkpoints: `save(state)` every `save_every`
    steps and at the end (step, trained parameters by name, optimizer state, stats so far); `resume=state`
    continues from one, and the resumed run is the interrupted one (same tasks, same sampling seeds)."""
    from serve.engine import EngineConfig, LLMEngine

    if not tasks:
        raise ValueError("no tasks")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    if not params:
        raise ValueError("nothing to train: no parameter requires grad (add LoRA adapters first)")
    if engine is None:
        n = cfg.prompts_per_step * cfg.group_size
        longest = max(len(t.prompt_ids) for t in tasks) + cfg.max_new_tokens
        engine = LLMEngine(
            model,
            tokenizer=tokenizer,
            # No prefix cache: a step's rollouts are then computed the same way whatever ran before, which
            # keeps a resumed run identical to the interrupted one.
            config=EngineConfig(max_num_seqs=n, max_model_len=longest + 1, seed=cfg.seed, enable_prefix_caching=False),
        )
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    history: list[StepStats] = []
    start = 0
    if resume is not None:
        restore_training_state(resume, named, opt)
        history = [StepStats(**h) for h in resume["history"]]
        start = resume["step"]
        engine.weights_changed()

    def checkpoint(step: int) -> None:
        if save is not None:
            save(training_state(step, named, opt, history=[asdict(h) for h in history]))

    for step in range(start, cfg.steps):
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) if cfg.warmup else cfg.lr
        for group in opt.param_groups:
            group["lr"] = lr
        which = task_order(len(tasks), step, cfg.prompts_per_step, cfg.seed)
        groups = rollout(engine, tasks, which, cfg, step, tokenizer)
        rewards = [r.reward for g in groups for r in g if r.reward is not None]
        if not rewards:
            errors = {getattr(tasks[t].score, "last_error", None) for t in which} - {None}
            raise RewardUnavailable(
                f"step {step + 1}: no completion could be scored (the reward returned None for all "
                f"{sum(len(g) for g in groups)})" + (f": {sorted(errors)[0]}" if errors else "")
            )
        signal = sum(1 for g in groups if any(a for a in advantages([r.reward for r in g]) if a))
        grad_norm, stats, old = 0.0, {"icepop_masked": 0.0, "mismatch": 0.0, "clipped": 0.0, "kl_rollout": 0.0}, None
        for u in range(cfg.updates_per_batch):
            opt.zero_grad(set_to_none=True)
            loss, st, old = grpo_backward(model, groups, cfg, old)
            if loss is None:
                break
            norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            opt.step()
            if u == 0:
                grad_norm, stats = norm, st
            else:
                stats["clipped"] = max(stats["clipped"], st["clipped"])
        if signal:
            engine.weights_changed()  # in place: the engine serves the same tensors; its prefix cache is stale
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        history.append(
            StepStats(
                step=step + 1,
                reward_mean=mean,
                reward_std=math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0,
                groups_with_signal=signal,
                groups=len(groups),
                failed=sum(1 for g in groups for r in g if r.reward is None),
                pg_grad_norm=grad_norm,
                completion_tokens=sum(len(r.ids) for g in groups for r in g) / sum(len(g) for g in groups),
                **stats,
            )
        )
        if log is not None:
            log(history[-1])
        if save_every and (step + 1) % save_every == 0 and step + 1 < cfg.steps:
            checkpoint(step + 1)
    checkpoint(cfg.steps)
    return history
