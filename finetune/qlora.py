"""Frozen base linears that stay in their stored precision and are dequantised per layer in the forward: the
modules a LoRA adapter (peft) wraps when the base is FP8, INT4 or frozen bf16 (finetune/sharded_load.py).

    FrozenFP8Linear    float8_e4m3fn weight + fp32 scale_inv per 128 x 128 block, as GLM-5-FP8 ships
    FrozenInt4Linear   compressed-tensors pack-quantized int4 (glm5's `model quantize` format)
    FrozenDenseLinear  a plain weight that does not train (a bf16 / fp32 checkpoint's)

Each is a leaf of FSDP2's sharding like any parameter holder: its stored tensors are parameters (requires_grad
False) so FSDP shards them over the ranks and all-gathers them, as stored, for the layer that runs. The forward
dequantises the whole weight to the input's dtype, multiplies, and drops it; the backward dequantises again
(`_DequantMatmul`, as bitsandbytes' 4-bit matmul does) rather than keeping the dense weight for it, so a layer's
dense weights never outlive its matmul. No gradient reaches the base: only the adapter trains.

The stored tensors are not named `weight` on purpose: peft moves an adapter to the device and dtype of its base's
`weight` (meta during the sharded build, float8 for FP8) and would lose the adapter's seeded initialisation or
cast it to float8; `compute_dtype` (what peft reads instead) keeps the adapter fp32. The FP8 weight's parameter
is `weight_fp8`, the one name that differs from the checkpoint's (`weight`): `CHECKPOINT_NAMES` maps it back.
"""

from __future__ import annotations

import abc
import math

import torch
import torch.nn.functional as F
from torch import nn

from model.compressed_tensors import PACK_FACTOR, Int4Scheme, decompress
from model.fp8 import FP8_BLOCK, dequantize_fp8
from model.int4_numerics import dequantize_weight

CHECKPOINT_NAMES = {"weight_fp8": "weight", "weight_frozen": "weight"}  # parameter -> checkpoint local name


class _DequantMatmul(torch.autograd.Function):
    """y = x W^T with W dequantised in the forward and again in the backward (never saved): grad x only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, module: nn.Module) -> torch.Tensor:
        ctx.module = module
        return F.linear(x, module.dequantize(x.dtype))

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        return grad_y @ ctx.module.dequantize(grad_y.dtype), None


class _Frozen(nn.Module, abc.ABC):
    compute_dtype = torch.float32  # what peft keeps the adapter in (see the module docstring)

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._spec: list[tuple[str, tuple, torch.dtype]] = []
        # Until `allocate`: an empty CPU parameter, the one peft finds (next(base.parameters())) to place adapters
        self.unallocated = nn.Parameter(torch.empty(0), requires_grad=False)

    def _frozen(self, name: str, shape, dtype) -> None:
        self._spec.append((name, tuple(shape), dtype))

    def allocate(self, device: torch.device | str = "meta") -> _Frozen:
        """Register the stored tensors (uninitialised, on `device`). Separate from __init__ because peft puts a
        new adapter on the device of its base's first parameter: the sharded build adds the adapters while the
        base has none, so they are created for real (and seeded), then allocates the base on meta."""
        self._parameters.pop("unallocated", None)
        for name, shape, dtype in self._spec:
            t = torch.empty(shape, dtype=dtype, device=device)
            self.register_parameter(name, nn.Parameter(t, requires_grad=False))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            return _DequantMatmul.apply(x, self)
        return F.linear(x, self.dequantize(x.dtype))

    def dense_weight(self) -> torch.Tensor:  # MLA's absorbed path reads kv_b_proj's matrix
        return self.dequantize(torch.float32)

    @abc.abstractmethod
    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a dense matrix of `dtype` (each format's own rule)."""


class FrozenFP8Linear(_Frozen):
    """W = W_fp8 * scale_inv per [block, block] tile (model/fp8.py), computed in the forward."""

    def __init__(self, in_features: int, out_features: int, block: int = FP8_BLOCK):
        super().__init__(in_features, out_features)
        self.block = block
        self._frozen("weight_fp8", (out_features, in_features), torch.float8_e4m3fn)
        scales = (math.ceil(out_features / block), math.ceil(in_features / block))
        self._frozen("weight_scale_inv", scales, torch.float32)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_fp8(self.weight_fp8, self.weight_scale_inv, self.block).to(dtype)


class FrozenInt4Linear(_Frozen):
    """Group-wise int4 (compressed-tensors' tensors, model/compressed_tensors.py), dequantised in the forward."""

    def __init__(self, in_features: int, out_features: int, scheme: Int4Scheme, scale_dtype: torch.dtype):
        super().__init__(in_features, out_features)
        self.scheme = scheme
        groups = math.ceil(in_features / scheme.group_size)
        self._frozen("weight_packed", (out_features, math.ceil(in_features / PACK_FACTOR)), torch.int32)
        self._frozen("weight_scale", (out_features, groups), scale_dtype)
        self._frozen("weight_shape", (2,), torch.int64)
        if not scheme.symmetric:
            self._frozen("weight_zero_point", (math.ceil(out_features / PACK_FACTOR), groups), torch.int32)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_weight(decompress(dict(self.named_parameters()), self.scheme), dtype)


class FrozenDenseLinear(_Frozen):
    """A plain frozen weight (a full-precision base's target linear) under the same adapter handling."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype):
        super().__init__(in_features, out_features)
        self._frozen("weight_frozen", (out_features, in_features), dtype)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight_frozen.to(dtype)


FROZEN_TYPES = (FrozenFP8Linear, FrozenInt4Linear, FrozenDenseLinear)
