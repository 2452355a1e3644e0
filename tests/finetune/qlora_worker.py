"""Run under `torchrun --nproc-per-node N` by tests/finetune/test_sharded_load.py and benchmarks/qlora_sharded.py:
SFT with LoRA over a frozen FP8 / INT4 base built by finetune/sharded_load.py, each rank reading its own rows.

    qlora_worker.py CKPT OUT.json [--steps S] [--budget-mb MB] [--reference] [--offload]

Every rank reports its losses, the bytes of the frozen base it holds (its shards: parameters and buffers that
are not the adapter's), its adapter bytes, and its peak resident memory. `--budget-mb`: after joining the process
group, the rank's address space is limited (RLIMIT_AS) to what it maps then plus MB: a rank that loaded the
whole model would fail. `--reference`: rank 0 also trains the same model in one process (no FSDP) and reports
its losses and bytes."""

from __future__ import annotations

import argparse
import json
import resource

import torch

from finetune.distributed import Distributed
from finetune.lora import LoraSettings
from finetune.sft import SFTConfig, train_sft
from finetune.sharded_load import load_lora_sharded
from finetune.train_loop import OptimConfig


def data() -> list[tuple[list[int], list[bool]]]:
    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(8):
        ids = torch.randint(0, 1000, (24 + 4 * i,), generator=g).tolist()
        seqs.append((ids, [j >= 8 for j in range(len(ids))]))
    return seqs


def frozen_bytes(model) -> tuple[int, int]:
    """(bytes of the base this process holds, bytes of its adapter), local shards only."""
    base = lora = 0
    for n, t in list(model.named_parameters()) + list(model.named_buffers()):
        local = t.to_local() if hasattr(t, "to_local") else t
        size = local.numel() * local.element_size()
        if "lora_" in n:
            lora += size
        else:
            base += size
    return base, lora


def train(ckpt: str, steps: int, dist, offload: bool = False):
    model, named = load_lora_sharded(ckpt, LoraSettings(rank=4), dist, seed=1)
    base, lora = frozen_bytes(model)
    cfg = SFTConfig(OptimConfig(steps=steps, lr=5e-3, warmup=1, offload=offload), batch_size=4, seed=0)
    hist = train_sft(model, data(), cfg, named=named, dist=dist)
    return [h.lm for h in hist], base, lora


def address_space_now(field: str = "VmSize") -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget-mb", type=float, default=0)
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--offload", action="store_true")  # the ranks' AdamW state in host memory (finetune/offload.py)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist = Distributed.from_env()
    dist.init()
    import peft  # noqa: F401  (its imports are the process's baseline, not the model's)

    limit, dense_load, baseline = None, None, address_space_now()
    if a.budget_mb:
        limit = baseline + int(a.budget_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    losses, base, lora = train(a.ckpt, a.steps, dist, a.offload)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if a.budget_mb:  # what every rank did before: the whole model, dequantised to fp32
        from model import GLM5ForCausalLM

        try:
            GLM5ForCausalLM.from_pretrained(a.ckpt, dtype=torch.float32)
            dense_load = "loaded"
        except (MemoryError, RuntimeError) as e:
            dense_load = f"failed: {type(e).__name__}"
    mine = {"losses": losses, "base_bytes": base, "adapter_bytes": lora, "peak_rss": peak, "as_limit": limit,
            "dense_load": dense_load, "address_space_used": address_space_now("VmPeak") - baseline}  # fmt: skip
    import torch.distributed as td

    everyone = [None] * dist.world_size
    td.all_gather_object(everyone, mine)
    if dist.is_main:
        result = {"ranks": everyone}
        if a.reference:
            ref_losses, ref_base, ref_lora = train(a.ckpt, a.steps, None)
            result["reference"] = {"losses": ref_losses, "base_bytes": ref_base, "adapter_bytes": ref_lora}
        with open(a.out, "w") as f:
            json.dump(result, f)
    dist.close()


if __name__ == "__main__":
    main()
