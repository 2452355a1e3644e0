"""Test checkpoints of a frozen base in the released precisions: `write_fp8` (GLM-5-FP8's layout: float8_e4m3fn
linears + fp32 `weight_scale_inv` per 128 x 128 block, the embeddings, norms, router, indexer weights_proj and
lm_head kept) and `write_int4` (glm5's own `model quantize`, compressed-tensors). Also run by
benchmarks/qlora_sharded.py."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from model import GLM5ForCausalLM
from model.config import preset
from model.fp8 import quantize_fp8

KEEP = ("embed_tokens", "lm_head", "norm", "mlp.gate.", "weights_proj", "eh_proj")


def write_dense(path: Path, name: str = "tiny", seed: int = 0, **changes) -> Path:
    GLM5ForCausalLM.from_config(preset(name).replace(**changes), seed=seed).save_pretrained(path, "50MB")
    return path


def write_fp8(src: Path, out: Path) -> Path:
    """src (a dense checkpoint) -> out with every 2-D linear weight in FP8, shard for shard."""
    out.mkdir(parents=True, exist_ok=True)
    index = src / "model.safetensors.index.json"
    files = sorted(src.glob("model*.safetensors"))
    weight_map = {}
    for f in files:
        fp8 = {}
        for name, t in load_file(f).items():
            if t.dim() == 2 and not any(k in name for k in KEEP):
                fp8[name], fp8[name + "_scale_inv"] = quantize_fp8(t)
            else:
                fp8[name] = t
        save_file(fp8, out / f.name, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(fp8, f.name)
    if index.is_file():
        (out / index.name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    raw = json.loads((src / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(raw))
    return out


def write_int4(src: Path, out: Path, group_size: int = 32) -> Path:
    from model.int4_write import quantize_checkpoint

    quantize_checkpoint(src, out, group_size=group_size)
    return out


def write_random_fp8(path: Path, cfg, shard_bytes: int = 32 * 2**20, seed: int = 0) -> Path:
    """An FP8 checkpoint of `cfg` written straight from random values (no dense copy on disk or in memory: one
    tensor at a time), in shards of about `shard_bytes`: for tests whose model must be large next to a process's
    own overhead."""
    import torch

    path.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        shapes = {n: t.shape for n, t in GLM5ForCausalLM(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    shards: list[dict] = [{}]
    size = 0
    for name, shape in shapes.items():
        if name.endswith("e_score_correction_bias"):
            tensors = {name: torch.zeros(shape)}
        elif len(shape) == 1:
            tensors = {name: torch.ones(shape)}
        else:
            w = torch.randn(shape, generator=g)
            if any(k in name for k in KEEP):
                tensors = {name: w * 0.02}
            else:  # fp8 values ~N(0, 1) with a scale of 0.02 per block: N(0, 0.02) weights, no quantiser run
                blocks = (-(-shape[0] // 128), -(-shape[1] // 128))
                tensors = {name: w.to(torch.float8_e4m3fn), name + "_scale_inv": torch.full(blocks, 0.02)}
        n = sum(t.numel() * t.element_size() for t in tensors.values())
        if shards[-1] and size + n > shard_bytes:
            shards.append({})
            size = 0
        shards[-1] |= tensors
        size += n
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, path / fname, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, fname)
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg.replace(quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}).save(path)
    return path
