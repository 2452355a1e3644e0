"""How much of a LoRA adapter's change survives merging it and rounding the merged weights to INT4 again?

    python benchmarks/bench_adapter_rounding.py BASE ADAPTER [ADAPTER ...] [--json]

BASE is the checkpoint the adapter was trained on (`model.safetensors`), ADAPTER a peft adapter folder
(`adapter_config.json`, `adapter_model.safetensors`: `glm5 finetune rl/sft` write OUT/adapter). Over every
adapted linear whose input width is a multiple of INT4's group (128), with D = (alpha / r) B A:

    delta      |D| / |W|                     how far the adapter moved the weights
    rounding   |Q(W) - W| / |W|              how far INT4 (g128, symmetric, the serve's `--quant int4`) moves them
    lost       |Q(W + D) - Q(W) - D| / |D|   the served change of the merged, requantized checkpoint against D:
                                             0 means the adapter's change is served as trained; above 1, the
                                             served change is mostly rounding

    served     |L(X) - X (Q(W) + D)^T| / |X D^T|   what `glm5 serve BASE --quant int4 --lora ADAPTER` serves: the
                                             INT4 layer L with the adapter's factors beside its int4 weight
                                             (`Int4Linear.set_low_rank`), on random inputs X: 0 up to the kernel's
                                             arithmetic. (Until 2026-12-04 serve merged the adapter and then
                                             quantized: the `lost` column.) The proof serves its RL stage so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rounding(base: Path, adapter: Path, group: int = 128) -> dict[str, float | int]:
    import torch
    from safetensors.torch import load_file

    from model.int4_numerics import fake_quantize_weight

    weights = load_file(str(base / "model.safetensors"))
    lora = load_file(str(adapter / "adapter_model.safetensors"))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    from model.int4_linear import Int4Linear

    sums = {"d": 0.0, "q": 0.0, "w": 0.0, "lost": 0.0, "xd": 0.0, "served": 0.0}
    gen = torch.Generator().manual_seed(0)
    layers = 0
    for key, a in lora.items():
        if not key.endswith("lora_A.weight"):
            continue
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        w = weights.get(name)
        if w is None or w.shape[1] % group:
            continue
        w = w.float()
        d = scale * lora[key.replace("lora_A", "lora_B")].float() @ a.float()
        q = fake_quantize_weight(w, group)
        with torch.no_grad():
            sums["d"] += float(d.pow(2).sum())
            sums["q"] += float((q - w).pow(2).sum())
            sums["w"] += float(w.pow(2).sum())
            sums["lost"] += float((fake_quantize_weight(w + d, group) - q - d).pow(2).sum())
            layer = Int4Linear.from_linear(_linear(w), group)
            layer.set_low_rank(a.float(), scale * lora[key.replace("lora_A", "lora_B")].float())
            x = torch.randn(64, w.shape[1], generator=gen)
            sums["xd"] += float((x @ d.t()).pow(2).sum())
            sums["served"] += float((layer(x) - x @ (q + d).t()).pow(2).sum())
        layers += 1
    if not layers:
        raise SystemExit(f"{adapter}: no adapted linear of {base} with an input width divisible by {group}")
    return {"layers": layers, "delta": (sums["d"] / sums["w"]) ** 0.5, "rounding": (sums["q"] / sums["w"]) ** 0.5,
            "lost": (sums["lost"] / sums["d"]) ** 0.5 if sums["d"] else 0.0,
            "served": (sums["served"] / sums["xd"]) ** 0.5 if sums["xd"] else 0.0}  # fmt: skip


def _linear(w):
    import torch

    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    return lin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("adapters", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true", help="one JSON object per adapter on stdout")
    args = ap.parse_args()
    for adapter in args.adapters:
        r = rounding(args.base, adapter)
        if args.json:
            print(json.dumps({"base": str(args.base), "adapter": str(adapter), **r}))
        else:
            print(f"{adapter}: {r['layers']} linears, |D|/|W| {r['delta']:.4f}, |Q(W)-W|/|W| {r['rounding']:.4f}, "
                  f"|Q(W+D)-Q(W)-D|/|D| {r['lost']:.2f}, served with --quant int4 --lora {r['served']:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
