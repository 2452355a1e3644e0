"""Supervised fine-tuning on what the agent recorded: the masked next-token loss on the model's own tokens.

    model = add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(rank=16))   # finetune/lora.py
    seqs = recorded_sequences(files, tokenizer)       # (ids, prompt length): finetune/data/trajectories.py
    train_sft(model, seqs, SFTConfig(steps=200, lr=2e-4))
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
from finetune.lora import DEFAULT_TARGETS, LoraSettings, add_lora, load_adapter, merge_lora, save_adapter
from finetune.train_loop import LossTerms, OptimConfig, train

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
    """An SFT run: the optimizer schedule, the batch and the seed of the batch order."""

    steps: int = 200
    lr: float = 2e-4
    warmup: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 4
    seed: int = 0

    @property
    def optim(self) -> OptimConfig:
        return OptimConfig(self.steps, self.lr, self.warmup, self.weight_decay, self.grad_clip)


def sft_loss(model, ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> LossTerms:
    """Mean next-token cross-entropy over the target tokens: logits at t score token t+1 where mask[t+1]."""
    logits = model(ids_BT)
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids_BT[:, 1:].flatten(), reduction="none")
    m = mask_BT[:, 1:].flatten().to(ce.dtype)
    loss = (ce * m).sum() / m.sum().clamp(min=1.0)
    return LossTerms(loss, float(loss.detach()), tokens=ids_BT.numel())


def train_sft(
    model,
    seqs: list[tuple[list[int], int]],
    cfg: SFTConfig = SFTConfig(),
    log_every: int = 0,
    log=print,
    resume: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
    on_step=None,
) -> list[LossTerms]:
    """Masked next-token loss on the response tokens of (ids, prompt length) pairs; only what requires grad
    (the LoRA parameters after add_lora) trains. The loop's resume / save / save_every give exact resume."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("nothing to train: add_lora first")
    batches = padded_batches(seqs, cfg.batch_size, 2, cfg.seed)
    loop = {"log_every": log_every, "log": log, "resume": resume, "save": save, "save_every": save_every}
    return train(model, named, batches, lambda b: sft_loss(model, *b), cfg.optim, on_step=on_step, **loop)
