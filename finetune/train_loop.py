"""The explicit training loop every finetune recipe runs: data -> forward -> loss -> backward -> clip -> step,
with checkpoints that a rerun resumes from exactly (torchtune's principle: no Trainer class, a loop you read).

    history = train(model, named_params, batches, loss_fn, OptimConfig(steps=200, lr=2e-4))

`loss_fn(batch) -> LossTerms` is the recipe's (the MTP objective, SFT's masked next-token loss); the loop knows
nothing of what a batch holds. AdamW (betas 0.9 / 0.95, as GLM-5 and DeepSeek-V3) with a linear warm-up and a
cosine decay to 10% of the peak.

Checkpoints: every `save_every` steps `save(state)` gets the training state (step, trained parameters by name,
optimizer state, the losses so far); `resume=state` restores them and skips the first `state["step"]` batches,
so a deterministic batch stream makes the resumed run the run that was interrupted, bit for bit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from finetune.offload import HostAdamW


@dataclass
class LossTerms:
    """One step's loss. `loss` is what to backpropagate; the rest are detached numbers for logs: `lm` the
    next-token loss, `mtp` one value per chained MTP step, `tokens` the tokens the step read (for tokens/s)."""

    loss: torch.Tensor
    lm: float
    mtp: list[float] = field(default_factory=list)
    tokens: int = 0

    @property
    def mtp_mean(self) -> float:
        return sum(self.mtp) / len(self.mtp) if self.mtp else 0.0


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to 10%."""

    steps: int = 300
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    offload: bool = False  # AdamW's state in host memory (finetune/offload.py, --offload-optimizer)

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class StepInfo:
    """What a progress display gets after every step."""

    step: int  # steps done, 1-based
    steps: int
    loss: LossTerms
    lr: float
    seconds: float  # this step's wall time


def micro_batches(batch, rows: int) -> list:
    """A batch (a tensor, or a tuple of tensors whose first dimension is the batch's) in pieces of `rows` rows
    (0: one piece),
    each cut after its last target (the mask is the batch's second tensor): a causal model's tokens after the
    last target change no loss, and a padded row is mostly such tokens."""
    parts = batch if isinstance(batch, tuple) else (batch,)
    rows = rows if rows > 0 else parts[0].shape[0]
    out = []
    for r0 in range(0, parts[0].shape[0], rows):
        piece = tuple(x[r0 : r0 + rows] for x in parts)
        if len(piece) > 1:
            hits = piece[1].any(0).nonzero()
            end = int(hits[-1]) + 1 if len(hits) else piece[1].shape[1]
            piece = tuple(x[:, :end] for x in piece)
        out.append(piece if isinstance(batch, tuple) else piece[0])
    return out


def backward_micro(batch, rows: int, loss_of: Callable[[object], LossTerms]) -> LossTerms:
    """Backpropagate `batch` in micro-batches of `rows` rows: the gradient of the whole batch with the memory of
    one micro-batch, when `loss_of(micro)` normalises by the whole batch's target count (each micro-batch's
    terms then sum to the batch's). rows=1 also takes the model's batch-1 CPU kernels, which a batch of several
    rows cannot: 2.7x faster for four equal 2k-token rows of `tiny` without LoRA, but slower with LoRA on two
    unequal rows (CPU time, one loaded machine), so the default is the whole batch. -> the summed, detached loss."""
    return backward_each(micro_batches(batch, rows), loss_of)


def backward_each(pieces: list, loss_of: Callable[[object], LossTerms]) -> LossTerms:
    """Backpropagate `loss_of(piece)` for each piece in turn (gradients accumulate). -> the summed, detached
    loss terms."""
    total: LossTerms | None = None
    for micro in pieces:
        out = loss_of(micro)
        out.loss.backward()
        if total is None:
            total = LossTerms(out.loss.detach(), out.lm, list(out.mtp), out.tokens)
        else:
            total.loss = total.loss + out.loss.detach()
            total.lm += out.lm
            total.mtp = [a + b for a, b in zip(total.mtp, out.mtp, strict=True)]
            total.tokens += out.tokens
    assert total is not None
    return total


def make_optimizer(params: list[torch.Tensor], cfg: OptimConfig) -> torch.optim.AdamW | HostAdamW:
    """AdamW, fused (one C++ kernel over all the tensors) wherever torch has the kernel: on CPU torch's default is
    its for-loop, about ten ops per tensor, which with LoRA's hundreds of small factors was ~10% of a `tiny` SFT
    step (tiny's 144 factors: 174 ms loop vs 47 ms fused per step on a loaded 2-core box). The same update as the
    loop (tests/finetune/test_train_loop.py). FSDP2's sharded DTensors keep the loop. `cfg.offload`: the same
    update with its state in host memory (finetune/offload.py)."""
    if cfg.offload:
        return HostAdamW(params, cfg)
    return torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), fused=_fusable(params) or None
    )


def _fusable(params: list[torch.Tensor]) -> bool:
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if any(isinstance(p, DTensor) for p in params):
            return False
    # Fused AdamW needs each tensor dense in memory: the MoE's per-expert weights are strided views into their
    # stacked tensor, on which the fused kernel's update was measured wrong (full fine-tuning of `tiny`: loss 5.97 vs
    # the loop's 5.65 after one step), so any non-contiguous parameter keeps the loop.
    return bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point and p.is_contiguous() for p in params
    )


def train(
    model,
    named: list[tuple[str, torch.Tensor]],
    batches: Iterable,
    loss_fn: Callable[[object], LossTerms],
    cfg: OptimConfig,
    log_every: int = 0,
    log=print,
    resume: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
    on_step: Callable[[StepInfo], None] | None = None,
    opt: torch.optim.Optimizer | None = None,
) -> list[LossTerms]:
    """Optimise the parameters `named` for `cfg.steps` steps. -> every step's loss (the resumed ones included).
    `named` may also hold tensors that train by another rule (a router's bias buffer, no grad): they are saved
    and restored with the checkpoints but not given to the optimizer.
    `on_step(StepInfo)` after each step (progress); `log` every `log_every` steps (text)."""
    params = [p for _, p in named if p.requires_grad]
    opt = opt or make_optimizer(params, cfg)
    history: list[LossTerms] = []
    if resume is not None:
        restore_training_state(resume, named, opt)
        history = [_from_record(r) for r in resume["losses"]]
    model.train()
    it = iter(batches)
    for _ in range(len(history)):  # the batches the interrupted run already trained on
        next(it)
    try:
        for step in range(len(history), cfg.steps):
            t0 = time.perf_counter()
            lr = cfg.lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            out = loss_fn(next(it))
            if out.loss.requires_grad:  # else loss_fn backpropagated its micro-batches itself (backward_micro)
                out.loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            history.append(out)
            if on_step is not None:
                on_step(StepInfo(step + 1, cfg.steps, out, lr, time.perf_counter() - t0))
            if log_every and (step % log_every == 0 or step == cfg.steps - 1):
                mtp = " ".join(f"{x:.3f}" for x in out.mtp)
                log(f"step {step:4d}  lm {out.lm:.3f}  mtp [{mtp}]  lr {lr:.2e}")
            if save is not None and save_every and (step + 1) % save_every == 0 and step + 1 < cfg.steps:
                save(training_state(step + 1, named, opt, losses=[_record(h) for h in history]))
    finally:
        model.eval()
    return history


def _record(h: LossTerms) -> list:
    return [h.lm, list(h.mtp), h.tokens]


def _from_record(r) -> LossTerms:
    lm, mtp, *rest = r  # (lm, mtp) from older checkpoints, (lm, mtp, tokens) now
    return LossTerms(torch.tensor(sum(mtp) / max(1, len(mtp))), lm, list(mtp), rest[0] if rest else 0)


def training_state(step: int, named: list[tuple[str, torch.Tensor]], opt, **extra) -> dict:
    """A resumable checkpoint of a training loop: the step, the trained parameters by name, the optimizer
    state, and the loop's own `extra` (its history). `restore_training_state` reads it back."""
    return {"step": step, "params": {n: p.detach().clone() for n, p in named}, "optimizer": opt.state_dict(), **extra}


def restore_training_state(state: dict, named: list[tuple[str, torch.Tensor]], opt) -> None:
    """Put a `training_state` back into the parameters (in place) and the optimizer."""
    if set(state["params"]) != {n for n, _ in named}:
        raise ValueError("the checkpoint does not match this model and configuration (different parameters)")
    with torch.no_grad():
        for n, p in named:
            p.copy_(state["params"][n])
    # The saved param_groups carry the saving optimizer's implementation (fused / foreach); a run resumed in
    # another layout (a single process's fused AdamW -> FSDP2's DTensors, which keep the loop) must keep its own.
    impl = [{k: g.get(k) for k in _IMPL_KEYS} for g in opt.param_groups]
    opt.load_state_dict(state["optimizer"])
    for g, own in zip(opt.param_groups, impl, strict=True):
        g.update(own)


_IMPL_KEYS = ("fused", "foreach", "capturable", "differentiable")
