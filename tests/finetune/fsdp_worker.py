"""Run by tests/finetune/test_distributed.py under `torchrun --nproc-per-node 2`: one SFT step's gradient and
clipping norm on FSDP2-sharded `tiny` models (LoRA, full) against the same model unsharded in rank 0, for
batches that split unevenly over the ranks (and one row only: a rank with nothing but an empty micro-batch).
Rank 0 writes {case: [max relative gradient error, sharded norm, reference norm, sharded loss, reference loss]}
as JSON to argv[1]. On CUDA the sharded model runs FSDP's mixed precision (bf16 parameters, fp32 reduction)
against the fp32 reference on the CPU."""

from __future__ import annotations

import json
import sys

import torch

from finetune.distributed import Distributed
from finetune.full import prepare_full
from finetune.lora import LoraSettings, add_lora
from finetune.sft import sft_loss
from finetune.train_loop import backward_micro
from model import GLM5ForCausalLM
from model.config import preset


def build(kind: str):
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=3)
    if kind == "full":
        return model, prepare_full(model)
    model = add_lora(model, LoraSettings(rank=4), seed=1)
    with torch.no_grad():  # B starts at 0 (no gradient into A): give it values so that A's gradient is tested
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(n)))
    return model, [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def batch(rows: int):
    g = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, 1000, (rows, 20), generator=g)
    mask = torch.rand(rows, 20, generator=g) > 0.3
    mask[:, 0] = False
    if rows > 1:
        mask[1, 12:] = False  # a shorter row
    return ids, mask


def step(model, named, b, micro, dist=None):
    denom = b[1][:, 1:].sum()
    loss_of = lambda m: sft_loss(model, *m, denom=denom)  # noqa: E731
    out = dist.backward(b, micro, loss_of) if dist else backward_micro(b, micro, loss_of)
    params = [p for _, p in named if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, 1e9)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    grads = {
        n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for n, p in named if p.grad is not None
    }
    return out.lm, float(norm), grads


def main() -> None:
    torch.set_num_threads(1)
    dist = Distributed.from_env()
    dist.init()
    results = {}
    for kind, rows, micro in [("lora", 3, 0), ("lora", 1, 0), ("full", 3, 1)]:
        model, named = build(kind)
        named = dist.shard(model, named)
        b = batch(rows)
        loss, norm, grads = step(model, named, b, micro, dist)
        if dist.is_main:
            ref_model, ref_named = build(kind)
            ref_loss, ref_norm, ref = step(ref_model, ref_named, b, micro)
            assert grads.keys() == ref.keys(), set(grads) ^ set(ref)
            err = max(float((grads[n] - ref[n]).abs().max() / ref[n].abs().max().clamp(min=1e-30)) for n in ref)
            results[f"{kind}-{rows}rows-micro{micro}"] = [err, norm, ref_norm, loss, ref_loss]
    if dist.is_main:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)
    dist.close()


if __name__ == "__main__":
    main()
