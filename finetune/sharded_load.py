"""LoRA over a frozen base that no process holds whole: the model built on the meta device, the base linears kept
in their stored precision (finetune/qlora.py), FSDP2 over the ranks, and each rank reading from the safetensors
files only the rows of each tensor that it owns.

    model, named = load_lora_sharded(ckpt, LoraSettings(rank=16), dist)   # dist None: one process, whole
    train_sft(model, seqs, cfg, named=named, dist=dist)                   # the usual loop (finetune/sft.py)

The life of a load:
1. config.json -> GLM5ForCausalLM on meta (no memory); experts untied (FSDP shards contiguous tensors).
2. Every linear with a quantised tensor in the checkpoint (FP8: a `weight_scale_inv`; INT4: `weight_packed`)
   and every LoRA target becomes a Frozen* module on meta: the stored tensors as frozen parameters.
3. peft adds the adapters (finetune/lora.add_lora, seeded): they are created for real on the CPU, since their
   base has no `weight` to follow to meta, and are kept aside (a few MB for GLM-5's rank 16 per rank... per
   model: the adapters only).
4. Each decoder layer gets activation checkpointing (torch's composable `checkpoint`: its inside is recomputed
   in the backward; parameter names unchanged), then FSDP2 (finetune/distributed.py's `wrap`).
5. `to_empty` gives every rank storage for its own shards only; the adapters get their rows of the kept
   initial values; each frozen tensor gets its rows read by `safe_open(...).get_slice(name)[start:stop]`, so a
   rank reads (and the page cache serves) about 1/world of the checkpoint. FSDP2's Shard(0) layout: rank r owns
   rows [r * ceil(N / world), ...) of a tensor with N rows (torch.chunk's split).

What stays whole on every rank: the routers' bias buffers (a few KB). Non-quantised tensors (embeddings, norms,
the indexer, the lm_head) are read in the compute dtype (fp32 on CPU, bf16 on CUDA; the router fp32).
Every missing, unexpected or mis-shaped tensor is collected and reported in one CheckpointError, as
model/checkpoint.py does.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed._composable import checkpoint

from finetune.distributed import _untie_experts
from finetune.lora import LoraSettings, add_lora
from finetune.qlora import CHECKPOINT_NAMES, FROZEN_TYPES, FrozenDenseLinear, FrozenFP8Linear, FrozenInt4Linear
from model import GLM5ForCausalLM
from model.checkpoint import _FP32_SUFFIXES, CheckpointError, _names, weight_files, without_absent_mtp
from model.compressed_tensors import read_quantization_config
from model.config import GLM5Config
from model.quant_int4 import set_submodule


def base_format(cfg: GLM5Config) -> str:
    """fp8, int4 or dense: how the checkpoint of `cfg` stores its linears."""
    quant = (cfg.quantization_config or {}).get("quant_method")
    return {"fp8": "fp8", "compressed-tensors": "int4"}.get(quant, "dense")


def _swap_frozen(model, cfg: GLM5Config, path: Path, names: set[str], targets: tuple[str, ...], dtype) -> int:
    """Step 2: replace the quantised linears and the LoRA targets by Frozen* modules (on meta). -> how many."""
    fmt = base_format(cfg)
    block = int(((cfg.quantization_config or {}).get("weight_block_size") or [128])[0])
    qcfg = None
    if fmt == "int4":
        qcfg = read_quantization_config(path)
    n_main = cfg.num_hidden_layers
    swapped = 0
    for mname, mod in list(model.named_modules()):
        if type(mod) is not nn.Linear:
            continue
        in_main = mname.startswith("model.layers.") and int(mname.split(".")[2]) < n_main
        is_target = in_main and mname.rsplit(".", 1)[-1] in targets
        if fmt == "fp8" and f"{mname}.weight_scale_inv" in names:
            new = FrozenFP8Linear(mod.in_features, mod.out_features, block)
        elif fmt == "int4" and f"{mname}.weight_packed" in names:
            scheme = qcfg.scheme_for(mname, tuple(c.__name__ for c in nn.Linear.__mro__))
            if scheme is None:
                raise CheckpointError(f"{path}: {mname} has weight_packed but no config group targets it")
            new = FrozenInt4Linear(mod.in_features, mod.out_features, scheme, _scale_dtype(path, mname))
        elif is_target:
            new = FrozenDenseLinear(mod.in_features, mod.out_features, dtype)
        else:
            continue
        if mod.bias is not None:
            raise CheckpointError(f"{mname}: a frozen base linear with a bias is not supported")
        set_submodule(model, mname, new)
        swapped += 1
    return swapped


def _scale_dtype(path: Path, mname: str) -> torch.dtype:
    with safe_open(weight_files(path)[f"{mname}.weight_scale"], framework="pt") as f:
        return _dtype(f.get_slice(f"{mname}.weight_scale"))


def _dtype(sl) -> torch.dtype:
    names = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F8_E4M3": torch.float8_e4m3fn,
             "I32": torch.int32, "I64": torch.int64, "I8": torch.int8, "U8": torch.uint8}  # fmt: skip
    return names[sl.get_dtype()]


def checkpoint_name(param: str) -> str:
    """A parameter's tensor name in the checkpoint: peft's `.base_layer.` dropped, `weight_fp8` -> `weight`."""
    owner, _, local = param.replace(".base_layer.", ".").rpartition(".")
    return f"{owner}.{CHECKPOINT_NAMES.get(local, local)}"


def load_lora_sharded(path, settings: LoraSettings | None = LoraSettings(), dist=None, seed: int = 0,
                      checkpointing: bool = True, dtype: torch.dtype | None = None, device: str | None = None):  # fmt: skip
    """Steps 1-5 of the module docstring -> (model, named trainable parameters). `dist`: finetune.distributed's
    Distributed (joined), or None for one process (no FSDP: the same modules, whole, on `device`, default CPU).
    `settings` None: no adapter, every parameter frozen (a distillation teacher; no activation checkpointing,
    it only runs forwards)."""
    path = Path(path)
    cfg = without_absent_mtp(GLM5Config.from_pretrained(path), path)
    device = dist.device if dist is not None else torch.device(device or "cpu")
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    where = weight_files(path)
    with torch.device("meta"):
        model = GLM5ForCausalLM(cfg).to(dtype)
    for name, p in model.named_parameters():
        if name.endswith(_FP32_SUFFIXES):  # GLM-5 routes in fp32
            p.data = p.data.float()
    _untie_experts(model)
    _swap_frozen(model, cfg, path, set(where), settings.targets if settings else (), dtype)
    if settings is None:
        model.requires_grad_(False)
        checkpointing = False
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unsupported layer type")  # peft, of our Frozen* modules
            model = add_lora(model, settings, seed=seed)
    lora_init = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    for m in model.modules():
        if isinstance(m, FROZEN_TYPES):
            m.allocate("meta")
    if any(t.is_meta for t in lora_init.values()):
        bad = [n for n, t in lora_init.items() if t.is_meta]
        raise CheckpointError(
            f"LoRA target(s) not frozen base modules (the adapter followed them to meta): {_names(bad)}"
        )
    if checkpointing:
        for layer in model.model.layers:
            checkpoint(layer)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if dist is not None:
        named = dist.wrap(model, named, cast=False)
    model.to_empty(device=device)
    world, rank = (dist.world_size, dist.rank) if dist is not None else (1, 0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in lora_init:
                _local(p).copy_(_rows_of(lora_init[name], p, world, rank))
        _read_owned(model, path, where, world, rank, dtype)
    model.config = cfg
    return model.train(), named


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def _row_range(p: torch.Tensor, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) rows of `p`'s global dim 0 that this rank holds (FSDP2's Shard(0): torch.chunk's split)."""
    local = _local(p)
    if local is p:
        return 0, p.shape[0] if p.dim() else 0
    chunk = math.ceil(p.shape[0] / world)
    start = min(rank * chunk, p.shape[0])
    return start, start + local.shape[0]


def _rows_of(full: torch.Tensor, p: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    start, stop = _row_range(p, world, rank)
    return full[start:stop] if full.dim() else full


def _read_owned(model, path: Path, where: dict[str, Path], world: int, rank: int, dtype: torch.dtype) -> None:
    """Step 5: every frozen parameter and buffer gets its owned rows from the checkpoint; misfits reported."""
    tensors = [(n, p) for n, p in model.named_parameters() if "lora_" not in n] + list(model.named_buffers())
    expected = {checkpoint_name(n): (n, p) for n, p in tensors}
    missing = sorted(n for n in expected if n not in where)
    unexpected = sorted(n for n in where if n not in expected)
    problems = [f"missing {len(missing)} tensor(s): {_names(missing)}"] if missing else []
    problems += [f"{len(unexpected)} unexpected tensor(s): {_names(unexpected)}"] if unexpected else []
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit the config: " + "; ".join(problems))
    by_file: dict[Path, list[str]] = {}
    for cname in expected:
        by_file.setdefault(where[cname], []).append(cname)
    mismatched = []
    for file, cnames in by_file.items():
        with safe_open(file, framework="pt") as f:
            for cname in cnames:
                pname, p = expected[cname]
                sl = f.get_slice(cname)
                if tuple(sl.get_shape()) != tuple(p.shape):
                    mismatched.append(f"{cname} is {list(sl.get_shape())}, expected {list(p.shape)}")
                    continue
                start, stop = _row_range(p, world, rank)
                t = sl[start:stop] if p.dim() else f.get_tensor(cname)
                want = torch.float32 if cname.endswith(_FP32_SUFFIXES) else p.dtype
                if p.dtype in (torch.float8_e4m3fn, torch.int32, torch.int64) and t.dtype != p.dtype:
                    mismatched.append(f"{cname} is {t.dtype}, expected {p.dtype}")
                    continue
                _local(p).copy_(t.to(want))
    if mismatched:
        raise CheckpointError(f"checkpoint {path}: shape mismatch: {_names(mismatched, 3)}")
