"""The trainer: one explicit optimizer step per batch of groups (torchtune's loop, no Trainer base class).

    batch of groups -> advantages per group -> forward (log pi_theta of the sampled tokens, micro-batched)
    -> objective.sample_loss (per sample, or per token: --loss-agg) -> backward -> clip -> AdamW step -> version + 1

`version` counts optimizer steps; the weight push after each step makes it the rollout server's version, and
the staleness rule compares samples' versions with it. Samples are the TokenSamples of each rollout (one per
branch), each weighted by its rollout's advantage; a group whose rewards are all equal has no signal and adds
nothing (counted). Padded duplicates count as often as they appear, which is what padding means. What moves
is reported (the on-policy surrogate's value is 0 by construction): the policy-gradient norm before clipping,
KL to the rollout policy, the IS-masked fraction, the train/rollout mismatch.
"""

from __future__ import annotations

import time

import torch

from finetune.rl.config import RLConfig
from finetune.rl.objective import TokenStats, advantages, sample_loss, token_logprobs
from finetune.rl.rollout import Rollout


def token_advantages(s, a: float, refusal_penalty: float) -> float | torch.Tensor:
    """The advantage of each of sample s's sampled tokens: the session's A, and min(A, 0) - refusal_penalty on the
    tokens of a call a tool refused: a wasted turn is pushed down even in a session that went on to solve its task
    (a float when every token has the same)."""
    if not (refusal_penalty and s.refused):
        return a
    sampled = [t for t, m in enumerate(s.mask) if m]
    wasted = min(a, 0.0) - refusal_penalty
    return torch.tensor([wasted if any(lo <= t < hi for lo, hi in s.refused) else a for t in sampled])


class Trainer:
    def __init__(self, model, cfg: RLConfig, micro_batch: int = 8):
        self.model, self.cfg, self.micro_batch = model, cfg, micro_batch
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        if not self.params:
            raise ValueError("nothing to train: no parameter requires grad (add LoRA adapters first)")
        self.opt = self._optimizer()
        self.version = 0

    def _optimizer(self) -> torch.optim.AdamW:
        return torch.optim.AdamW(self.params, lr=self.cfg.lr, weight_decay=0.0)

    def reset_optimizer(self) -> None:
        """GLM-5 resets the optimizer after each weight update of the inference engine."""
        self.opt = self._optimizer()

    def step(self, groups: list[list[Rollout]]) -> dict:
        t0 = time.monotonic()
        work = []  # (TokenSample, advantage)
        signal = 0
        pen = self.cfg.refusal_penalty
        for group in groups:
            adv = advantages([r.reward for r in group])
            if any(a for a in adv if a):
                signal += 1
            for r, a in zip(group, adv, strict=True):
                if a is None:  # left out of the group (no reward)
                    continue
                a = a * self.cfg.negative_weight if a < 0 else a
                work += [(s, a) for s in r.samples if s.n_sampled and (a or (pen and s.refused))]
        stats = TokenStats()
        self.opt.zero_grad(set_to_none=True)
        per_token = self.cfg.loss_agg == "token"
        # sample: 1/G per sample, over the step's groups. token: one mean over every sampled token of the step's
        # groups (DAPO: zero-advantage samples count in the denominator though they add no term)
        n_tokens = sum(s.n_sampled for group in groups for r in group for s in r.samples)
        scale = 1.0 / max(1, n_tokens) if per_token else 1.0 / (self.cfg.group_size * len(groups))
        for i in range(0, len(work), self.micro_batch):
            part = work[i : i + self.micro_batch]
            lps = token_logprobs(self.model, [s for s, _ in part], self.cfg.temperature)
            loss = lps[0].new_zeros(())
            for (s, a), lp in zip(part, lps, strict=True):
                rollout = torch.tensor([x for x, m in zip(s.logprobs, s.mask, strict=True) if m], dtype=lp.dtype)
                term, st = sample_loss(lp, rollout, token_advantages(s, a, pen), self.cfg.band, per_token)
                loss = loss + term * scale
                stats.add(st)
            loss.backward()
        grad_norm = 0.0
        if work:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm))
            self.opt.step()
        self.version += 1
        seconds = time.monotonic() - t0
        return {
            "groups_with_signal": signal,
            "pg_grad_norm": grad_norm,
            "train_tokens": sum(len(s.ids) for s, _ in work),
            "train_tokens_per_s": sum(len(s.ids) for s, _ in work) / seconds if seconds > 0 else 0.0,
            "train_s": seconds,
            **stats.as_dict(),
        }

    def state(self) -> dict:
        return {
            "version": self.version,
            "params": {n: p.detach().clone() for n, p in self.named},
            "optimizer": self.opt.state_dict(),
        }

    def restore(self, state: dict) -> None:
        with torch.no_grad():
            for n, p in self.named:
                p.copy_(state["params"][n])
        self.opt.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
