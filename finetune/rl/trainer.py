"""The trainer: one explicit optimizer step per batch of groups (torchtune's loop, no Trainer base class).

    batch of groups -> advantages per group -> forward (log pi_theta of the sampled tokens, micro-batched)
    -> objective.sample_loss (per sample, or per token: --loss-agg) -> backward -> clip -> AdamW step
    (x updates_per_batch: later updates on the same batch against the first's logprobs, PPO's clip) -> version + 1

`version` counts the run's steps (batches); the weight push after each step makes it the rollout server's version, and
the staleness rule compares samples' versions with it. Samples are the TokenSamples of each rollout (one per
branch), each weighted by its rollout's advantage; a group whose rewards are all equal has no signal and adds
nothing (counted). Padded duplicates count as often as they appear, which is what padding means. What moves
is reported (the on-policy surrogate's value is 0 by construction): the policy-gradient norm before clipping,
KL to the rollout policy, the IS-masked fraction, the train/rollout mismatch. The learning rate follows the
config's warm-up (`lr_at(version)`). (finetune/grpo.py's own grpo_backward and loop became these options.)
"""

from __future__ import annotations

import time

import torch

from finetune.rl.config import RLConfig
from finetune.rl.objective import TokenStats, advantages, sample_loss, token_logprobs
from finetune.rl.rollout import Rollout, TokenSample
from finetune.train_loop import LossTerms


def token_advantages(s, a: float, refusal_penalty: float) -> float | torch.Tensor:
    """The advantage of each of sample s's sampled tokens: the session's A, and min(A, 0) - refusal_penalty on the
    tokens of a call a tool refused: a wasted turn is pushed down even in a session that went on to solve its task
    (a float when every token has the same)."""
    if not (refusal_penalty and s.refused):
        return a
    sampled = [t for t, m in enumerate(s.mask) if m]
    wasted = min(a, 0.0) - refusal_penalty
    return torch.tensor([wasted if any(lo <= t < hi for lo, hi in s.refused) else a for t in sampled])


_DUMMY = TokenSample([0, 0], [0, 1], [0.0, 0.0], 0)  # a rank's turn with nothing to train: the same forwards


class Trainer:
    """`dist` (torchrun, the policy sharded by finetune/sharded_load.py): every rank gets the step's groups and
    trains its contiguous share of the step's samples, in lock step with the others (finetune/distributed.py); the
    gradient and the reported numbers are one process's. finetune/rl/sharded.py drives the ranks."""

    def __init__(self, model, cfg: RLConfig, micro_batch: int = 8, dist=None):
        self.model, self.cfg, self.micro_batch, self.dist = model, cfg, micro_batch, dist
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

    def _work(self, groups: list[list[Rollout]]) -> tuple[list, int]:
        """-> the step's (TokenSample, advantage) pairs to train, the groups with signal."""
        work = []
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
        return work, signal

    def backward(self, groups: list[list[Rollout]], old: list[torch.Tensor] | None = None):
        """The step's loss over `groups`, back-propagated `micro_batch` samples at a time (the gradients add up;
        memory stays one micro-batch's) -> (its value, or None when no sample has a term; TokenStats; the trained
        samples' logprobs, detached: pi_train_old for a further update on the same batch, which passes them as
        `old`). The caller zeroes the gradients and steps the optimizer."""
        work, _ = self._work(groups)
        stats = TokenStats()
        if not work:
            return None, stats, old
        pen = self.cfg.refusal_penalty
        per_token = self.cfg.loss_agg == "token"
        # sample: 1/G per sample, over the step's groups. token: one mean over every sampled token of the step's
        # groups (DAPO: zero-advantage samples count in the denominator though they add no term)
        n_tokens = sum(s.n_sampled for group in groups for r in group for s in r.samples)
        scale = 1.0 / max(1, n_tokens) if per_token else 1.0 / (self.cfg.group_size * len(groups))
        reused, total = old is not None, 0.0
        old = list(old) if reused else []
        start, stop = (0, len(work)) if self.dist is None else self.dist.rows(len(work))
        micros = [list(range(i, min(i + self.micro_batch, stop))) for i in range(start, stop, self.micro_batch)]

        def micro_loss(idx: list[int] | None) -> LossTerms:
            nonlocal total
            if idx is None:  # a rank with fewer micro-batches than another: a dummy through the same forwards
                (lp,) = self._logprobs([_DUMMY])
                return LossTerms(lp.sum() * 0.0, 0.0)
            part = [work[k] for k in idx]
            lps = self._logprobs([s for s, _ in part])
            if not reused:
                old.extend(lp.detach() for lp in lps)
            loss = lps[0].new_zeros(())
            for k, (s, a), lp in zip(idx, part, lps, strict=True):
                rollout = torch.tensor([x for x, m in zip(s.logprobs, s.mask, strict=True) if m], dtype=lp.dtype)
                term, st = sample_loss(lp, rollout, token_advantages(s, a, pen), self.cfg.band, per_token,
                                       old[k - start] if reused else None, self.cfg.clip)  # fmt: skip
                loss = loss + term * scale
                stats.add(st)
            total += float(loss.detach())
            return LossTerms(loss, 0.0)

        if self.dist is None:
            for idx in micros:
                micro_loss(idx).loss.backward()
            return total, stats, old
        self.dist.lockstep([(micros, micro_loss)])
        total, stats = self._summed(total, stats)
        return total, stats, old

    def _logprobs(self, samples: list) -> list[torch.Tensor]:
        if self.dist is None:
            return token_logprobs(self.model, samples, self.cfg.temperature)
        # out of the FSDP root as tensors of their own, not views of one (FSDP hooks the root's outputs)
        return self.dist.call(lambda ss: [lp.clone() for lp in token_logprobs(self.model, ss, self.cfg.temperature)],
                              samples)  # fmt: skip

    def _summed(self, total: float, st: TokenStats) -> tuple[float, TokenStats]:
        """This rank's loss and statistics summed over the ranks (what one process would report)."""
        t = torch.tensor([total, st.tokens, st.masked, st.mismatch, st.kl, st.clipped], dtype=torch.float64)
        t = self.dist.all_sum(t)
        return float(t[0]), TokenStats(int(t[1]), int(t[2]), float(t[3]), float(t[4]), int(t[5]))

    def step(self, groups: list[list[Rollout]]) -> dict:
        """`updates_per_batch` optimizer steps on `groups` (the first's statistics reported, with the largest
        clipped fraction of the others) at the warm-up's learning rate -> the step's trainer fields."""
        t0 = time.monotonic()
        work, signal = self._work(groups)
        for group in self.opt.param_groups:
            group["lr"] = self.cfg.lr_at(self.version)
        grad_norm, stats, old, clipped = 0.0, TokenStats(), None, 0.0
        for u in range(self.cfg.updates_per_batch):
            self.opt.zero_grad(set_to_none=True)
            loss, st, old = self.backward(groups, old)
            if loss is None:
                break
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a DTensor when sharded
            self.opt.step()
            if u == 0:
                grad_norm, stats = norm, st
            else:
                clipped = max(clipped, st.clipped / max(1, st.tokens))
        self.version += 1
        seconds = time.monotonic() - t0
        out = {
            "groups_with_signal": signal,
            "pg_grad_norm": grad_norm,
            "train_tokens": sum(len(s.ids) for s, _ in work),
            "train_tokens_per_s": sum(len(s.ids) for s, _ in work) / seconds if seconds > 0 else 0.0,
            "train_s": seconds,
            **stats.as_dict(),
        }
        if self.cfg.updates_per_batch > 1:
            out["clipped"] = clipped  # the largest fraction of tokens PPO's clip cut in one update
        return out

    def state(self) -> dict:
        return {
            "version": self.version,
            "params": {n: p.detach().clone() for n, p in self.named},
            "optimizer": self.opt.state_dict(),
        }

    def restore(self, state: dict) -> None:
        if "optimizer_by_name" in state:
            raise ValueError("this state.pt was written by a torchrun run (--qlora, its optimizer state keyed by "
                             "name): resume it under torchrun, or delete it to start over")  # fmt: skip
        with torch.no_grad():
            for n, p in self.named:
                p.copy_(state["params"][n])
        self.opt.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
