"""The policy-gradient objective on token samples: GLM-5's direct double-sided importance sampling
(finetuning-rl.md §1.3, Eqs. 3-5), with IcePop as the same rule on another band.

Per sampled token t of a sample with group-normalised advantage A (no pi_old: a trajectory whose calls span
weight versions has no single behaviour policy, so the rollout engine's own logprobs stand in for it):

    r_t   = exp(log pi_theta(y_t) - log pi_rollout(y_t))
    f(r)  = r inside the band [lo, hi], else 0
    loss  = -(1/G) sum_samples 1/|y| sum_t f(r_t) A            (mean over the step's groups)
          = -(1/sum_samples |y|) sum_samples sum_t f(r_t) A     (--loss-agg token: DAPO's token-level loss)

With r carrying the gradient, d loss = -A r grad log pi_theta inside the band and nothing outside: PPO with
pi_old := pi_rollout and a hard two-sided mask instead of min/clip. The double-sided band is [1 - eps_l,
1 + eps_h] (defaults 0.2 / 0.28); IcePop keeps [1/beta, beta] (beta = 2), which on-policy (one update per
batch, where pi_train_old = pi_theta) is GRPO + IcePop (report Eq. 1). Further updates on the same batch
(`updates_per_batch`) take pi_train_old = the first update's logprobs: the band masks pi_train_old / pi_rollout
and PPO's clip bounds q = pi_theta / pi_train_old (sample_loss's `old_N`). Reported per step: the
masked fraction, the mean |log pi_theta - log pi_rollout| (train/rollout mismatch) and KL(pi_rollout ||
pi_theta) by the k3 estimator r - 1 - log r, which is >= 0 per token.

Shapes: lp_N, rollout_N are one sample's N sampled tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class TokenStats:
    tokens: int = 0
    masked: int = 0
    mismatch: float = 0.0  # sum |log r|
    kl: float = 0.0  # sum of k3
    clipped: int = 0  # tokens whose ratio to pi_train_old PPO's clip cut (updates after a batch's first)

    def add(self, other: TokenStats) -> None:
        self.tokens += other.tokens
        self.masked += other.masked
        self.mismatch += other.mismatch
        self.kl += other.kl
        self.clipped += other.clipped

    def as_dict(self) -> dict:
        n = max(1, self.tokens)
        return {"is_masked": self.masked / n, "mismatch": self.mismatch / n, "kl_rollout": self.kl / n}


def advantages(rewards: list[float | None]) -> list[float | None]:
    """Group-normalised advantages (GRPO's): None for the left-out completions, all zero when there is no signal.
    (Moved from finetune/grpo.py.)"""
    scored = [r for r in rewards if r is not None]
    if len(scored) < 2:
        return [None if r is None else 0.0 for r in rewards]
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
    return [None if r is None else (r - mean) / (std + 1e-6) for r in rewards]


def sample_loss(
    lp_N: torch.Tensor,
    rollout_N: torch.Tensor,
    advantage: float | torch.Tensor,
    band: tuple[float, float],
    per_token: bool = False,
    old_N: torch.Tensor | None = None,
    clip: tuple[float, float] = (0.8, 1.28),
) -> tuple[torch.Tensor, TokenStats]:
    """This sample's term before the step's normalisation: -(1/N) sum_t f(r_t) A_t (the caller scales it by 1/G),
    or with `per_token` the sum -sum_t f(r_t) A_t (the caller divides by the step's trained tokens). `advantage`
    is one A for every token, or A_t per token (shape N: a turn-level penalty on some of them).

    `old_N` (a further update on a batch already trained once: pi_train_old, the first update's logprobs): the
    band masks rho = pi_train_old / pi_rollout, and the term is rho * min(q A, clip(q) A) with q = pi_theta /
    pi_train_old (PPO's clip), which at q = 1 is the term above (finetune/grpo.py's GRPO + IcePop)."""
    log_r = lp_N - rollout_N
    if old_N is None:
        r = torch.exp(log_r)
        keep = (r >= band[0]) & (r <= band[1])
        terms = torch.where(keep, r, torch.zeros_like(r)) * advantage
        clipped = 0
    else:
        rho = torch.exp(old_N - rollout_N)
        keep = (rho >= band[0]) & (rho <= band[1])
        q = torch.exp(lp_N - old_N)
        surrogate = torch.minimum(q * advantage, q.clamp(clip[0], clip[1]) * advantage)
        terms = torch.where(keep, rho, torch.zeros_like(rho)) * surrogate
        clipped = int(((q < clip[0]) | (q > clip[1])).sum())
    loss = -(terms.sum() if per_token else terms.mean())
    with torch.no_grad():
        lr = log_r.detach()
        st = TokenStats(
            tokens=lp_N.numel(),
            masked=int((~keep).sum()),
            mismatch=float(lr.abs().sum()),
            kl=float((torch.exp(lr) - 1 - lr).sum()),
            clipped=clipped,
        )
    return loss, st


def token_logprobs(model, samples: list, temperature: float) -> list[torch.Tensor]:
    """log pi_theta of each sample's sampled (mask 1) tokens, with gradient, at the sampling temperature. The
    lm_head runs only on the rows that predict sampled tokens (never a [B, T, V] logits tensor)."""
    T = max(len(s.ids) for s in samples)
    ids_BT = torch.tensor([s.ids + [0] * (T - len(s.ids)) for s in samples])  # right padding: no one sees a pad
    hidden_BTD = model.model(ids_BT, torch.arange(T).expand(len(samples), -1))
    where = [[t for t, m in enumerate(s.mask) if m] for s in samples]
    rows = torch.cat([hidden_BTD[b, torch.tensor(w) - 1] for b, w in enumerate(where)])
    lp = torch.log_softmax(model.lm_head(rows).float() / temperature, -1)
    lp = lp.gather(-1, torch.tensor([samples[b].ids[t] for b, w in enumerate(where) for t in w])[:, None])[:, 0]
    return list(lp.split([len(w) for w in where]))
