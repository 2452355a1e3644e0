"""The training objective of GLM-5 with its MTP layer: next-token LM loss plus the chained MTP loss.

GLM-5 trains one set of MTP weights shared over 3 recursive steps (TR §2.1, reference §5): step k (0-based)
predicts token t+2+k from the hidden that step k-1 produced at t (step 0: the main model's normed hidden h_t)
and the embedding of token t+1+k. Serving chains the same layer k times to draft k tokens, so training the
chain is what makes the 2nd and 3rd drafts useful (DeepSeek-V3 trains depth 1 only and runs it twice).

    logits, h = model(ids)                               h [B, T, D] after model.norm
    L_lm   = CE(logits[:, t], ids[:, t+1])
    for k in 0..num_steps-1:                             n = T-1-k rows
        d_k, h = model.mtp_forward(h[:, :n], ids[:, 1+k:], positions 1+k..T-1, step=k)
        L_k = CE(d_k[:, t], ids[:, t+2+k])               (the last row has no target; its hidden feeds step k+1)
    loss = L_lm + mtp_weight * mean_k(L_k)

`mtp_weight` is DeepSeek-V3's lambda (0.3 for most of pre-training, 0.1 at the end); the mean over steps is
their 1/D. GLM-5 does not publish its value; 0.3 is our default.

`loss_mask` [B, T] (bool, True = "this token is a training target", as finetune's chat loss masks) masks the
targets of every term alike, so SFT on agent trajectories trains the MTP layer on the assistant tokens only.
`train_main=False` runs the main model without gradients and returns the MTP loss alone: that adapts the MTP
layer to a fine-tuned main model without touching it (what to do after a LoRA SFT, so speculation still pays).

`targets="model"` (self-distillation, as Medusa-2 and EAGLE train their draft heads) replaces each MTP step's
text token by the main model's own distribution for it: step k at t is trained towards softmax(logits[:, t+1+k]),
the main model's prediction of token t+2+k from the true prefix, with KL(main || draft) as the loss. What the
drafts must match to be accepted is the main model's choice, not the text; on text the two differ wherever the
model is wrong. Run on sequences the model generated itself (finetune/mtp_align.py), the chained steps' inputs
are also what serving feeds them (the accepted drafts are the model's own tokens).

Shapes: B batch, T tokens, D hidden, V vocab.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from finetune.train_loop import LossTerms, OptimConfig, backward_micro, train


def _masked_ce(logits_BTV: torch.Tensor, targets_BT: torch.Tensor, mask_BT: torch.Tensor | None, denom=None):
    ce = F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten(), reduction="none")
    if mask_BT is None:
        return ce.mean() if denom is None else ce.sum() / denom
    m = mask_BT.flatten().to(ce.dtype)
    return (ce * m).sum() / (m.sum().clamp(min=1.0) if denom is None else denom)


def _masked_kl(teacher_logp_BTV: torch.Tensor, logits_BTV: torch.Tensor, mask_BT: torch.Tensor | None, denom=None):
    """KL(teacher || softmax(logits)) per position, averaged over the masked positions."""
    logq = F.log_softmax(logits_BTV.float(), dim=-1)
    kl = (teacher_logp_BTV.exp() * (teacher_logp_BTV - logq)).sum(-1).flatten()
    if mask_BT is None:
        return kl.mean() if denom is None else kl.sum() / denom
    m = mask_BT.flatten().to(kl.dtype)
    return (kl * m).sum() / (m.sum().clamp(min=1.0) if denom is None else denom)


def mtp_loss(
    model,
    input_ids: torch.Tensor,
    num_steps: int = 3,
    mtp_weight: float = 0.3,
    loss_mask: torch.Tensor | None = None,
    train_main: bool = True,
    targets: str = "tokens",
    denoms: list | None = None,
) -> LossTerms:
    """LM loss + `mtp_weight` * the mean of the `num_steps` chained MTP losses (module docstring).

    input_ids [B, T] with T >= num_steps + 2 (every step needs at least one target). `targets`: "tokens" (the
    text, GLM-5's MTP loss) or "model" (the main model's distribution, KL; module docstring). `denoms`: what
    to divide each term's sum by, [lm, step 0, step 1, ...] (`loss_denominators` of the whole batch, for a
    micro-batch of it); default this batch's own target counts.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    if num_steps and model.config.num_nextn_predict_layers == 0:
        raise ValueError("the model has no MTP layer (num_nextn_predict_layers is 0); use num_steps=0")
    if T < num_steps + 2:
        raise ValueError(f"sequences of {T} tokens are too short for {num_steps} MTP steps (need {num_steps + 2})")
    if loss_mask is not None and loss_mask.shape != input_ids.shape:
        raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
    if targets not in ("tokens", "model"):
        raise ValueError(f"targets must be 'tokens' or 'model', got {targets!r}")
    mask = loss_mask.bool() if loss_mask is not None else None

    with contextlib.nullcontext() if train_main else torch.no_grad():
        logits, h = model(input_ids, return_hidden=True)
    den = denoms or [None] * (num_steps + 1)
    lm = _masked_ce(logits[:, :-1], input_ids[:, 1:], None if mask is None else mask[:, 1:], den[0])
    if not train_main:
        h = h.detach()

    # The main model's log-distribution over token t+1 at each t, the soft target of every step (no gradient).
    teacher = F.log_softmax(logits.detach().float(), dim=-1) if targets == "model" else None
    steps = []
    for k in range(num_steps):
        n = T - 1 - k
        positions = torch.arange(1 + k, T, device=input_ids.device)
        draft, h = model.mtp_forward(h[:, :n], input_ids[:, 1 + k :], positions, step=k)
        target_mask = None if mask is None else mask[:, 2 + k :]
        if teacher is None:
            steps.append(_masked_ce(draft[:, : n - 1], input_ids[:, 2 + k :], target_mask, den[1 + k]))
        else:  # draft[:, t] and teacher[:, t+1+k] are both distributions over token t+2+k
            steps.append(_masked_kl(teacher[:, 1 + k : T - 1], draft[:, : n - 1], target_mask, den[1 + k]))
    mtp = torch.stack(steps).mean() if steps else lm.new_zeros(())
    loss = (lm + mtp_weight * mtp) if train_main else mtp
    return LossTerms(loss, float(lm.detach()), [float(s.detach()) for s in steps], tokens=input_ids.numel())


@dataclass(frozen=True)
class MTPTrainConfig:
    """A run of `train_mtp`: the loop's optimizer settings (train_loop.OptimConfig) and the objective's."""

    optim: OptimConfig = OptimConfig()
    num_mtp_steps: int = 3
    mtp_weight: float = 0.3
    train_main: bool = True
    targets: str = "tokens"  # or "model": self-distillation (mtp_loss)
    micro_batch: int = 0  # rows per forward/backward, gradients accumulated over the batch (0: the whole batch)


def loss_denominators(ids_BT: torch.Tensor, mask_BT: torch.Tensor | None, num_steps: int) -> list:
    """Each term's target count in a batch: [lm, step 0, ...] (what `mtp_loss` divides by)."""
    B, T = ids_BT.shape
    if mask_BT is None:
        return [B * (T - 1)] + [B * (T - 2 - k) for k in range(num_steps)]
    m = mask_BT.bool()
    return [m[:, 1:].sum().clamp(min=1)] + [m[:, 2 + k :].sum().clamp(min=1) for k in range(num_steps)]


def train_mtp(
    model,
    batches: Iterable[torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
    cfg: MTPTrainConfig = MTPTrainConfig(),
    **loop,
) -> list[LossTerms]:
    """The training loop (finetune/train_loop.py) on `mtp_loss`, `cfg.optim.steps` times. Returns every step's loss.
    A batch is ids [B, T] or (ids, loss mask [B, T]).

    With `train_main=False` only the MTP layer(s) are optimised (the main model is left exactly as it was).
    `loop`: the training loop's own options, passed to train_loop.train as they are: log_every, log, on_step, and
    resume / save / save_every, its exact-resume checkpoints (a deterministic batch stream, such as
    data.batches.token_batches or padded_batches with a seed, makes the resumed run the interrupted one).
    """
    n_main = model.config.num_hidden_layers
    if cfg.train_main:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    else:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and _layer_index(n) >= n_main]
    # MTP-only: everything else is frozen for the loop, so backward computes no gradient for the shared lm_head
    # and embedding (at GLM-5's size the lm_head's alone is 0.95G values per step), and restored after.
    trained = {id(p) for _, p in named}
    frozen = [] if cfg.train_main else [p for p in model.parameters() if p.requires_grad and id(p) not in trained]
    for p in frozen:
        p.requires_grad_(False)

    def loss_fn(batch) -> LossTerms:
        ids, mask = batch if isinstance(batch, tuple) else (batch, None)  # (ids, loss mask) or ids
        den = loss_denominators(ids, mask, cfg.num_mtp_steps)

        def micro(b) -> LossTerms:
            i, m = b if isinstance(b, tuple) else (b, None)
            return mtp_loss(model, i, cfg.num_mtp_steps, cfg.mtp_weight, m, cfg.train_main, cfg.targets, den)

        return backward_micro(batch, cfg.micro_batch, micro)

    try:
        return train(model, named, batches, loss_fn, cfg.optim, **loop)
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _layer_index(name: str) -> int:
    """`model.layers.{i}.…` -> i; -1 for parameters outside the layer stack (embedding, final norm, lm_head)."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[:2] == ["model", "layers"] else -1
