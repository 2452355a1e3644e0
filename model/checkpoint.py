"""Checkpoint I/O in the Hugging Face layout: config.json + model.safetensors, or shards + an index.

Loading builds the model on the meta device (no memory, no init), then assigns each parameter the tensor read
from the memory-mapped safetensors file, converted to the target dtype: weights are read once, never
initialised and then overwritten. FP8 block-quantised weights (float8_e4m3fn with a `<name>_scale_inv` of
fp32 scales, one per 128x128 block, as GLM-5-FP8 ships) are dequantised on load: W = W_fp8 * scale, and the
config loses its `quantization_config` (a later save writes plain weights).
The router (`mlp.gate.weight`, `e_score_correction_bias`) stays fp32 whatever the dtype, as GLM-5 routes in fp32.

A checkpoint whose config counts MTP layers but holds none of their tensors (transformers' `save_pretrained`
writes no `model.layers.{num_hidden_layers}.*`: its model has no MTP layer) loads without them, with one
warning; the model's config then says `num_nextn_predict_layers: 0`, so a save is true to what it holds and
speculative decoding with MTP refuses it. Some but not all MTP tensors is an error like any other.

Every problem is collected first and reported in one `CheckpointError` line that names the tensors: missing,
unexpected, or mis-shaped. Saving writes the same layout (per-expert tensor names), sharded by size.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from model.config import GLM5Config
from model.fp8 import FP8_BLOCK, dequantize_fp8
from model.int4_load import load_compressed_tensors

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model; the message names the tensors."""


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def weight_files(path: Path) -> dict[str, Path]:
    """tensor name -> file holding it, from the index (sharded) or the single file."""
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {f: path / f for f in set(weight_map.values())}
        absent = sorted(f for f, p in files.items() if not p.is_file())
        if absent:
            raise CheckpointError(f"{index} lists shard(s) that do not exist: {_names(absent)}")
        return {name: files[f] for name, f in weight_map.items()}
    single = path / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")
    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}


def side_files(path: Path, ignore: tuple[str, ...] = ()) -> list[Path]:
    """The checkpoint's other files (config, tokenizer, chat template: the regular files at its top level, not its
    weights and not those matching the glob patterns `ignore`) for a tool that writes a new checkpoint from it.
    A symbolic link counts only when it resolves to a file inside the checkpoint or inside the Hugging Face cache
    entry that holds it (a cached snapshot links into its `blobs/`): one that points elsewhere
    (`tokenizer.json -> ~/.ssh/id_rsa` in a downloaded folder) would copy that file into every checkpoint made
    from this one, which the user may then share. It is left out, with a warning."""
    path = Path(path)
    roots = [path.resolve()]
    roots += [q for q in roots[0].parents if q.name.startswith(("models--", "datasets--"))][:1]
    kept = []
    for f in sorted(path.iterdir()):
        if f.name.endswith(".safetensors") or f.name == INDEX_FILE or any(fnmatch.fnmatch(f.name, g) for g in ignore):
            continue
        if f.is_symlink():
            target = f.resolve()
            if not (target.is_file() and any(target.is_relative_to(r) for r in roots)):
                log.warning("%s links to %s, outside the checkpoint: not copied", f, target)
                continue
        if f.is_file():
            kept.append(f)
    return kept


def read_state_dict(
    path: Path, expected: dict[str, tuple[torch.Size, torch.dtype]], fp8_block: int = FP8_BLOCK
) -> dict[str, torch.Tensor]:
    """Read every expected tensor (converted to its expected dtype), or raise naming all the misfits."""
    where = weight_files(path)
    scales = {n for n in where if n.endswith("_scale_inv") and n[: -len("_scale_inv")] in where}
    missing = sorted(n for n in expected if n not in where)
    unexpected = sorted(n for n in where if n not in expected and n not in scales)
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {_names(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s): {_names(unexpected)}")
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit the config: " + "; ".join(problems))
    out: dict[str, torch.Tensor] = {}
    mismatched: list[str] = []
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(where[name], []).append(name)
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as f:  # memory-mapped: get_tensor reads only that tensor
            for name in names:
                shape, dtype = expected[name]
                t = f.get_tensor(name)
                if t.dtype == torch.float8_e4m3fn:
                    sname = name + "_scale_inv"
                    if sname not in where:
                        raise CheckpointError(f"FP8 tensor {name} has no {sname} in {path}")
                    with safe_open(where[sname], framework="pt") as fs:
                        t = dequantize_fp8(t, fs.get_tensor(sname), fp8_block)
                if t.shape != shape:
                    mismatched.append(f"{name} is {list(t.shape)}, expected {list(shape)}")
                    continue
                out[name] = t.to(dtype)
    if mismatched:
        raise CheckpointError(f"checkpoint {path}: shape mismatch: {_names(mismatched, 3)}")
    return out


def has_mtp_tensors(cfg: GLM5Config, names) -> bool:
    """Whether any tensor of the MTP layers (`model.layers.{n}.*` for n >= num_hidden_layers) is among `names`."""
    prefixes = tuple(f"model.layers.{cfg.num_hidden_layers + j}." for j in range(cfg.num_nextn_predict_layers))
    return bool(prefixes) and any(n.startswith(prefixes) for n in names)


def _mtp_absent(cfg: GLM5Config, path: Path) -> bool:
    return cfg.num_nextn_predict_layers > 0 and not has_mtp_tensors(cfg, weight_files(path))


def without_absent_mtp(cfg: GLM5Config, path: Path) -> GLM5Config:
    """The config, with num_nextn_predict_layers 0 if it counts MTP layers that the checkpoint has no tensor of."""
    if not _mtp_absent(cfg, path):
        return cfg
    log.warning(
        "%s has no MTP layer (no model.layers.%d.* tensors, as transformers' save_pretrained writes it): loaded "
        "without it; speculative decoding with MTP is unavailable for this checkpoint",
        path,
        cfg.num_hidden_layers,
    )
    return cfg.replace(num_nextn_predict_layers=0)


def checkpoint_has_mtp(path: str | Path) -> bool:
    """Whether the checkpoint directory holds an MTP layer (config and tensor names only; no weights are read)."""
    path = Path(path)
    cfg = GLM5Config.from_pretrained(path)
    return cfg.num_nextn_predict_layers > 0 and not _mtp_absent(cfg, path)


def _dtype_of(cfg: GLM5Config) -> torch.dtype:
    return getattr(torch, cfg.dtype) if isinstance(cfg.dtype, str) and hasattr(torch, cfg.dtype) else torch.bfloat16


def load_pretrained(cls, path: str | Path, dtype: torch.dtype | None = None, device: str = "cpu"):
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    cfg = without_absent_mtp(GLM5Config.from_pretrained(path), path)
    dtype = dtype or _dtype_of(cfg)
    with torch.device("meta"):
        model = cls(cfg)
    if (cfg.quantization_config or {}).get("quant_method") == "compressed-tensors":  # INT4 W4A16
        return load_compressed_tensors(model, path, dtype, device, _FP32_SUFFIXES).eval()
    expected = {}
    for name, t in model.state_dict().items():
        expected[name] = (t.shape, torch.float32 if name.endswith(_FP32_SUFFIXES) else dtype)
    quant = cfg.quantization_config or {}
    block = quant.get("weight_block_size") or [FP8_BLOCK, FP8_BLOCK]
    if block[0] != block[1]:
        raise CheckpointError(f"{path}: FP8 weight_block_size {block} is not square")
    state = read_state_dict(path, expected, fp8_block=int(block[0]))
    model.load_state_dict(state, strict=True, assign=True)
    if quant.get("quant_method") == "fp8":  # the weights are dequantised now: a save must not claim FP8
        model.config = cfg.replace(quantization_config=None)
    model = model.to(device).eval()
    model.tie_experts()  # loading assigned fresh per-expert tensors: stack them again for the grouped GEMMs
    return model


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)B?\s*", size.upper())
    if not m:
        raise ValueError(f"cannot read a size from {size!r} (use e.g. 5GB, 500MB or a byte count)")
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)])


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """safetensors refuses tensors that share memory: copy views (e.g. tied expert weights) out."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def save_pretrained(model, path: str | Path, max_shard_size: int | str = "5GB") -> None:
    """Write config.json, generation_config.json and the weights (one file, or shards + index)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg: GLM5Config = model.config
    state = {k: _own_storage(v.detach().cpu()) for k, v in model.state_dict().items()}
    dtypes = {v.dtype for k, v in state.items() if not k.endswith(_FP32_SUFFIXES)}
    cfg = cfg.replace(dtype=str(dtypes.pop()).removeprefix("torch.") if len(dtypes) == 1 else cfg.dtype)
    cfg.save(path)
    write_generation_config(cfg, path)
    limit = _parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > limit:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    for old in list(path.glob("model*.safetensors")) + [path / INDEX_FILE]:
        old.unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], path / SINGLE_FILE, metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, path / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def write_generation_config(cfg: GLM5Config, path: Path) -> None:
    """GLM-5's generation defaults: temperature 1.0, top_p 0.95, the config's eos / pad / bos."""
    eos = list(cfg.eos_ids)
    gen = {
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 0.95,
        "eos_token_id": eos if len(eos) != 1 else eos[0],
        "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id,
    }
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
