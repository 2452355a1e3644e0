"""Writing a compressed-tensors W4A16 checkpoint (model/compressed_tensors.py) from an unquantized one.

`quantize_checkpoint` (what `glm5 model quantize` runs) decides per linear: quantized with
model/int4_numerics.py, kept in high precision (GLM-5's FP8 split, `DEFAULT_SKIP` of model/quant_int4.py) or not a
linear at all. `write_quantized_checkpoint` does the writing, tensor by tensor, so peak memory is one tensor:
read the source, convert each tensor, write shards, the index, the side files and config.json.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from model.checkpoint import INDEX_FILE, side_files
from model.compressed_tensors import Int4Scheme, Int4Tensors, QuantizationConfig, compress
from model.fp8 import dequantize_fp8
from model.int4_linear import GROUP_SIZES
from model.int4_numerics import quantize_weight, scale_dtype_for
from model.quant_int4 import DEFAULT_SKIP, is_skipped

SHARD_BYTES = 2 * 1024**3

# Linear-shaped checkpoint tensors that are not linears (listed neither as quantized nor in `ignore`).
NOT_LINEAR: tuple[str, ...] = (r"(^|\.)embed_tokens$",)


def quantize_checkpoint(
    src: str | Path,
    out: str | Path,
    group_size: int = 128,
    symmetric: bool = True,
    skip: Iterable[str] = DEFAULT_SKIP,
    progress: Callable[[str], None] | None = None,
    mse: bool = True,
) -> dict:
    """Write `src` (an unquantized HF-layout checkpoint) to `out` as compressed-tensors W4A16 pack-quantized.

    Tensor by tensor, so peak memory is one tensor. Linears matched by `skip`, or whose in_features is not a
    multiple of `group_size`, stay in their dtype and go to the config's `ignore` list. Returns a summary.
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    skip = tuple(skip)

    def classify(module: str, w: torch.Tensor) -> str:
        if is_skipped(module, NOT_LINEAR):
            return "keep"
        if is_skipped(module, skip) or w.shape[1] % group_size:
            return "ignore"
        return "quantize"

    def quantize_fn(w: torch.Tensor) -> Int4Tensors:
        return quantize_weight(w, group_size, symmetric, mse, scale_dtype=scale_dtype_for(w.dtype))

    return write_quantized_checkpoint(
        src,
        out,
        quantize_fn,
        classify,
        Int4Scheme(group_size, symmetric, observer="mse" if mse else "minmax"),
        progress=progress,
    )


# ---------------------------------------------------------------------------------------------------------------
# Writing a checkpoint from an unquantized one, tensor by tensor (never the whole model in memory).


@dataclass
class _Tally:
    """What a write did so far: the modules quantized and ignored, bytes read and written."""

    quantized: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0


def write_quantized_checkpoint(
    src: str | Path,
    out: str | Path,
    quantize_fn: Callable[[torch.Tensor], Int4Tensors],
    classify: Callable[[str, torch.Tensor], str],
    scheme: Int4Scheme,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Quantize the 2-D `*.weight` tensors for which `classify(module_name, w)` says "quantize"; copy the rest.

    `classify` answers "quantize", "ignore" (a linear kept in high precision: listed in `ignore`) or "keep"
    (not a linear at all, e.g. embeddings). 1-D tensors (norms, biases) are always copied.

    Writes `*.safetensors` shards + `model.safetensors.index.json`, copies the non-weight files (tokenizer,
    chat template, generation config) and adds `quantization_config` to `config.json`. Returns a summary.
    """
    src, out = Path(src), Path(out)
    cfg, shards, where = _read_source(src, out)
    out.mkdir(parents=True, exist_ok=True)
    tally = _Tally()
    tensors = _converted_tensors(shards, where, quantize_fn, classify, progress, tally)
    weight_map, n_files = _write_shards(out, tensors)
    (out / INDEX_FILE).write_text(
        json.dumps(
            {"metadata": {"total_size": tally.bytes_out}, "weight_map": dict(sorted(weight_map.items()))}, indent=2
        )
    )
    _write_side_files(
        src, out, cfg, QuantizationConfig(groups={"group_0": scheme}, ignore=tuple(sorted(tally.ignored)))
    )
    return {
        "quantized_modules": len(tally.quantized),
        "ignored_modules": sorted(tally.ignored),
        "bytes_in": tally.bytes_in,
        "bytes_out": tally.bytes_out,
        "files": n_files,
    }


def _read_source(src: Path, out: Path) -> tuple[dict, list[Path], dict[str, Path]]:
    """The source's config, its shards and which shard holds each tensor; refuses a source that cannot be one."""
    if (src / "config.json").resolve() == (out / "config.json").resolve():
        raise ValueError("--out must be a different directory from the source checkpoint")
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("quantization_config"):
        raise ValueError(f"{src} is already quantized ({cfg['quantization_config'].get('quant_method')})")
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors in {src}")
    where: dict[str, Path] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            where.update(dict.fromkeys(f.keys(), shard))
    return cfg, shards, where


def _converted_tensors(
    shards: list[Path],
    where: dict[str, Path],
    quantize_fn: Callable[[torch.Tensor], Int4Tensors],
    classify: Callable[[str, torch.Tensor], str],
    progress: Callable[[str], None] | None,
    tally: _Tally,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The output checkpoint's tensors in the source's order: a quantized module's packed tensors in place of its
    weight, every other tensor as it is (FP8 ones dequantized); `tally` counts as they go."""
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name.endswith("_scale_inv") and name[: -len("_scale_inv")] in where:
                    continue  # an FP8 block scale, consumed with its weight below
                w = f.get_tensor(name)
                tally.bytes_in += w.numel() * w.element_size()
                if w.dtype == torch.float8_e4m3fn:
                    # GLM-5-FP8 source: dequantize (128x128 block scales) first; FP8 tensors that stay in
                    # high precision are written as bf16, since the output is not an FP8 checkpoint.
                    w = _dequantize_fp8(w, name, where).to(torch.bfloat16)
                module = name.removesuffix(".weight")
                if name.endswith(".weight") and w.ndim == 2 and w.is_floating_point():
                    kind = classify(module, w)
                    if kind == "quantize":
                        if progress:
                            progress(module)
                        tally.quantized.append(module)
                        for local, t in compress(quantize_fn(w)).items():
                            tally.bytes_out += t.numel() * t.element_size()
                            yield f"{module}.{local}", t
                        continue
                    if kind == "ignore":
                        tally.ignored.append(module)
                tally.bytes_out += w.numel() * w.element_size()
                yield name, w


def _write_shards(out: Path, tensors: Iterator[tuple[str, torch.Tensor]]) -> tuple[dict[str, str], int]:
    """Write `tensors` to shards of about SHARD_BYTES, named by the HF "-of-" convention once their count is
    known. -> (tensor name -> shard file name, number of shards)."""
    weight_map: dict[str, str] = {}
    chunk: dict[str, torch.Tensor] = {}
    chunk_bytes = 0
    tmp_names: list[str] = []

    def flush() -> None:
        nonlocal chunk, chunk_bytes
        if not chunk:
            return
        fname = f"model-{len(tmp_names) + 1:05d}.safetensors"
        save_file(chunk, str(out / fname), metadata={"format": "pt"})
        tmp_names.append(fname)
        weight_map.update(dict.fromkeys(chunk, fname))
        chunk, chunk_bytes = {}, 0

    for name, t in tensors:
        chunk[name] = t.contiguous()
        chunk_bytes += t.numel() * t.element_size()
        if chunk_bytes >= SHARD_BYTES:
            flush()
    flush()
    # Rename to the HF "-of-" convention now that the shard count is known.
    n_files = len(tmp_names)
    final: dict[str, str] = {}
    for i, fname in enumerate(tmp_names, 1):
        new = f"model-{i:05d}-of-{n_files:05d}.safetensors"
        (out / fname).rename(out / new)
        final[fname] = new
    return {k: final[v] for k, v in weight_map.items()}, n_files


def _write_side_files(src: Path, out: Path, cfg: dict, qcfg: QuantizationConfig) -> None:
    """Copy the source's non-weight files and write its config.json with the `quantization_config` block."""
    for p in side_files(src, ignore=("config.json",)):
        shutil.copyfile(p, out / p.name)
    cfg["quantization_config"] = qcfg.to_json()
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def _dequantize_fp8(w: torch.Tensor, name: str, where: dict[str, Path]) -> torch.Tensor:
    sname = name + "_scale_inv"
    if sname not in where:
        raise ValueError(f"FP8 tensor {name} has no {sname} in the checkpoint")
    with safe_open(str(where[sname]), framework="pt") as f:
        return dequantize_fp8(w, f.get_tensor(sname))
