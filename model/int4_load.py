"""Loading a compressed-tensors W4A16 checkpoint (model/compressed_tensors.py) into a model: an `Int4Linear`
swapped in for every module the checkpoint stores packed, every other tensor assigned as usual.

The loader (model/checkpoint.py) calls `load_compressed_tensors` for a config whose quantization_config says
compressed-tensors; `apply_compressed_tensors` is its swap step, for callers that load the rest themselves.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from model.compressed_tensors import (
    CompressedTensorsError,
    QuantizationConfig,
    packed_modules,
    read_quantization_config,
    read_tensors,
)
from model.int4_gate_up import fuse_gate_up
from model.int4_linear import Int4Linear
from model.quant_int4 import set_submodule


def apply_compressed_tensors(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    qcfg: QuantizationConfig,
    impl: str = "fast",
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """Swap in an `Int4Linear` for every module that has `weight_packed` in the checkpoint `state`.

    The loader's hook for compressed-tensors checkpoints: call it before loading the rest, with the state dict
    read from the safetensors files; `dtype` is the model's compute dtype. Each quantized module must exist in
    `model` as a linear of the same shape and be targeted by a config group. Returns the state dict to load
    into the swapped model as usual (`model.load_state_dict(rest, strict=True)` works).
    """
    quantized = packed_modules(state.keys())
    rest: dict[str, torch.Tensor] = {}
    by_module: dict[str, dict[str, torch.Tensor]] = {m: {} for m in quantized}
    for k, v in state.items():
        owner, _, local_name = k.rpartition(".")
        if owner in by_module:
            by_module[owner][local_name] = v
        else:
            rest[k] = v
    for module in sorted(quantized):
        local = by_module[module]
        try:
            target = model.get_submodule(module)
        except AttributeError:
            raise CompressedTensorsError(
                f"checkpoint has quantized {module!r} but the model has no such module"
            ) from None
        if not isinstance(target, nn.Linear | Int4Linear):
            raise CompressedTensorsError(f"{module}: quantized in the checkpoint but is a {type(target).__name__}")
        scheme = qcfg.scheme_for(module, tuple(c.__name__ for c in nn.Linear.__mro__))
        if scheme is None:
            raise CompressedTensorsError(f"{module}: has weight_packed but no config group targets it (or ignored)")
        if device is not None:
            local = {k: v.to(device) for k, v in local.items()}
        new = Int4Linear.from_checkpoint(local, scheme, impl, where=module, compute_dtype=dtype)
        if (new.out_features, new.in_features) != (target.out_features, target.in_features):
            raise CompressedTensorsError(
                f"{module}: checkpoint weight is [{new.out_features}, {new.in_features}], "
                f"model expects [{target.out_features}, {target.in_features}]"
            )
        if (new.bias is None) != (target.bias is None):
            raise CompressedTensorsError(f"{module}: bias presence differs between checkpoint and model")
        set_submodule(model, module, new)
        # What the new module keeps as state (bias; the buffers when plain) is loaded again by the caller's
        # strict load_state_dict, so the returned dict always matches the swapped model's state_dict keys.
        rest.update({f"{module}.{k}": local[k] for k in new.state_dict() if k in local})
    return rest


def load_compressed_tensors(
    model: nn.Module,
    path: str | Path,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    fp32_suffixes: tuple[str, ...] = (),
    impl: str = "fast",
) -> nn.Module:
    """Load a compressed-tensors W4A16 checkpoint into `model` (built on the meta device, or real).

    Quantized modules become `Int4Linear`s built on `device`; every other tensor is converted to `dtype`
    (those ending in `fp32_suffixes`, the router, to fp32) and assigned. Returns the model.
    """
    qcfg = read_quantization_config(path)
    if qcfg is None:
        raise CompressedTensorsError(f"{path}: config.json has no quantization_config")
    state = read_tensors(path)
    rest = apply_compressed_tensors(model, state, qcfg, impl=impl, device=device, dtype=dtype)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(rest))
    unexpected = sorted(set(rest) - set(expected))
    if missing or unexpected:
        raise CompressedTensorsError(
            f"checkpoint {path} does not fit the model: missing {missing[:4]} unexpected {unexpected[:4]}"
        )
    for name, t in rest.items():
        if t.is_floating_point():
            t = t.to(torch.float32 if name.endswith(fp32_suffixes) else dtype)
        if tuple(t.shape) != tuple(expected[name].shape):
            raise CompressedTensorsError(f"{name} is {list(t.shape)}, the model expects {list(expected[name].shape)}")
        rest[name] = t.to(device)
    model.load_state_dict(rest, strict=True, assign=True)
    model = model.to(device)
    fuse_gate_up(model)
    return model
