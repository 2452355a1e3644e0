"""Supervised fine-tuning on what the agent recorded: the masked next-token loss on the model's own tokens.

    model = add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(rank=16))   # finetune/lora.py
    seqs = recorded_sequences(files, tokenizer)       # (ids, prompt length): finetune/data/trajectories.py
    train_sft(model, seqs, SFTConfig(OptimConfig(steps=200, lr=2e-4, warmup=10)))
    save_adapter(model, out)

The loss is the next-token cross-entropy on the target tokens, averaged over them (every other token is
context), run by the training loop of finetune/train_loop.py (AdamW, warm-up + cosine, clipping, checkpoints
and exact resume).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from finetune.data.batches import padded_batches
from finetune.data.packing import packed_batches
from finetune.lora import DEFAULT_TARGETS, LoraSettings, add_lora, load_adapter, merge_lora, save_adapter
from finetune.train_loop import LossTerms, OptimConfig, backward_micro, train

__all__ = [  # the LoRA helpers are re-exported: `finetune.sft` was their home (serve_cmd, grpo import them here)
    "DEFAULT_TARGETS",
    "LoraSettings",
    "SFTConfig",
    "add_lora",
    "load_adapter",
    "merge_lora",
    "save_adapter",
    "sft_loss",
    "train_sft",
]


@dataclass(frozen=True)
class SFTConfig:
    """An SFT run: the optimizer schedule (train_loop.OptimConfig), the batch and the seed of the batch order."""

    optim: OptimConfig = OptimConfig(steps=200, lr=2e-4, warmup=10)
    micro_batch: int = 0  # rows per forward/backward, gradients accumulated over the batch (0: the whole batch)
    batch_size: int = 4  # sequences per step; with `pack`, rows of `pack_len` tokens per step
    seed: int = 0
    pack: bool = False
    pack_len: int = 2048
    # GLM-5's chained MTP loss on the same targets (finetune/mtp_objective.py): 0 leaves the MTP layer out of the
    # loss (it gets no gradient); n > 0 trains it over n recursive steps, weighted by mtp_weight
    mtp_steps: int = 0
    mtp_weight: float = 0.3


def mtp_targets(mask_BT: torch.Tensor, segment_ids=None, step: int = 0) -> torch.Tensor:
    """[B, T-2-step] bool: MTP step `step` at row t drafts token t+2+step; it is trained where that token is a
    target and, in a packed row, of the same sequence as t (the draft never reaches across a boundary)."""
    sel = mask_BT[:, 2 + step :].bool()
    if segment_ids is not None:
        sel = sel & (segment_ids[:, : sel.shape[1]] == segment_ids[:, 2 + step :])
    return sel


def sft_loss(
    model,
    ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    positions=None,
    segment_ids=None,
    denom=None,
    mtp_steps: int = 0,
    mtp_weight: float = 0.3,
    mtp_denoms=None,
) -> LossTerms:
    """Mean next-token cross-entropy over the target tokens: the hidden at t scores token t+1 where mask[t+1].
    Only the target rows go through the lm_head (TRL's chunked NLL does the same): with a 150k vocabulary the
    logits of the context tokens would be most of the step's work and memory, for nothing.
    `positions` / `segment_ids` [B, T]: packed rows (finetune/data/packing.py). `denom`: the number of targets
    to divide by (a micro-batch's loss is normalised by its whole batch's count); default this batch's.
    `mtp_steps` > 0 adds GLM-5's chained MTP loss (finetune/mtp_objective.py's, on the same targets, target rows
    only through the lm_head): loss = LM + mtp_weight * the mean over steps; `mtp_denoms` each step's target
    count in the whole batch (`mtp_targets`), default this batch's."""
    if positions is None:
        positions = torch.arange(ids_BT.shape[1], device=ids_BT.device).expand(ids_BT.shape[0], -1)
    model._check_ids(ids_BT)
    hidden = model.model(ids_BT, positions, segment_ids=segment_ids)  # [B, T, D] after the final norm
    sel = mask_BT[:, 1:]
    logits = model.lm_head(hidden[:, :-1][sel])  # [N, V], N target tokens
    ce = F.cross_entropy(logits.float(), ids_BT[:, 1:][sel], reduction="sum")
    lm = ce / (sel.sum().clamp(min=1) if denom is None else denom)
    steps, h, T = [], hidden, ids_BT.shape[1]
    for k in range(min(mtp_steps, T - 2)):  # step k needs a token t+2+k to draft
        n = T - 1 - k  # rows t = 0..n-1 draft token t+2+k from h_t and token t+1+k
        seg = None if segment_ids is None else segment_ids[:, 1 + k :]
        _, h = model.mtp_forward(h[:, :n], ids_BT[:, 1 + k :], positions[:, 1 + k :], step=k, segment_ids=seg,
                                 logits=False)  # fmt: skip
        tsel = mtp_targets(mask_BT, segment_ids, k)
        draft = model.lm_head(h[:, : n - 1][tsel])
        ce_k = F.cross_entropy(draft.float(), ids_BT[:, 2 + k :][tsel], reduction="sum")
        steps.append(ce_k / (tsel.sum().clamp(min=1) if mtp_denoms is None else mtp_denoms[k]))
    loss = lm + mtp_weight * torch.stack(steps).mean() if steps else lm
    return LossTerms(loss, float(lm.detach()), [float(x.detach()) for x in steps], tokens=ids_BT.numel())


def train_sft(
    model,
    seqs: list[tuple[list[int], int | list[bool]]],
    cfg: SFTConfig = SFTConfig(),
    log_every: int = 0,
    log=print,
    resume: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
    on_step=None,
    named: list[tuple[str, torch.Tensor]] | None = None,
    router_bias_rate: float = 0.0,
    dist=None,
) -> list[LossTerms]:
    """Masked next-token loss on the targets of (ids, prompt length or target mask) pairs; what trains is `named`
    (full.prepare_full's), by default whatever requires grad (the LoRA parameters after add_lora). The loop's
    resume / save / save_every give exact resume. `router_bias_rate` > 0: the routers' balancing rule after
    every step (finetune/full.py). `dist` (finetune/distributed.py, the model sharded by it): this rank trains
    on its rows of each batch, and the losses returned are the whole batch's, as in one process."""
    from finetune.full import RouterBalancer

    named = named if named is not None else [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not any(p.requires_grad for _, p in named):
        raise ValueError("nothing to train: add_lora (or prepare_full) first")
    if cfg.pack:
        masked = [(s, m if isinstance(m, list) else [i >= m for i in range(len(s))]) for s, m in seqs]
        batches = packed_batches(masked, cfg.pack_len, cfg.batch_size, cfg.seed)
    else:
        batches = padded_batches(seqs, cfg.batch_size, 2, cfg.seed)
    loop = {"log_every": log_every, "log": log, "resume": resume, "save": save, "save_every": save_every}

    def step(batch) -> LossTerms:
        denom = batch[1][:, 1:].sum().clamp(min=1)  # the whole batch's targets
        seg = batch[3] if len(batch) > 3 else None
        mtp = [mtp_targets(batch[1], seg, k).sum().clamp(min=1) for k in range(cfg.mtp_steps)]
        if dist is not None:
            denom, mtp = denom.to(dist.device), [d.to(dist.device) for d in mtp]
        kw = {"denom": denom, "mtp_steps": cfg.mtp_steps, "mtp_weight": cfg.mtp_weight, "mtp_denoms": mtp}
        if dist is not None:
            return dist.backward(batch, cfg.micro_batch, lambda b: sft_loss(model, *b, **kw))
        return backward_micro(batch, cfg.micro_batch, lambda b: sft_loss(model, *b, **kw))

    balancer = RouterBalancer(model, router_bias_rate, dist is not None) if router_bias_rate > 0 else None

    def after(info) -> None:
        if balancer is not None:
            balancer.update()
        if on_step is not None:
            on_step(info)

    try:
        return train(model, named, batches, step, cfg.optim, on_step=after, **loop)
    finally:
        if balancer is not None:
            balancer.close()
