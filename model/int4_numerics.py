"""Group-wise INT4 numerics of one weight matrix: quantize, dequantize, and the two composed (fake quantization).

Each row of `W [N, K]` is cut into groups of `group_size` input columns; a group stores int4 `q` in [-8, 7], a
scale and (asymmetric only) an int4 zero point, and `w = (q - zero_point) * scale`. The unpacked result is an
`Int4Tensors` of the compressed-tensors format (model/compressed_tensors.py packs it for a checkpoint); the
layer that multiplies by it is `Int4Linear` (model/int4_linear.py). QAT (finetune/qat.py) trains through
`fake_quantize_weight`, so trained and served numerics are one function.

What this file does not know: modules, kernels, checkpoints. Shapes: N = out_features, K = in_features,
G = K / group_size groups.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.compressed_tensors import Int4Tensors

# Range shrink factors tried per group by the MSE search (1.0 = plain min/max).
MSE_GRID = tuple(1.0 - 0.025 * i for i in range(17))  # 1.0 .. 0.6


def _qparams(lo: torch.Tensor, hi: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    eps = torch.finfo(torch.float32).eps
    if symmetric:
        scale = (torch.maximum(-lo, hi) / 7.5).clamp(min=eps)
        return scale, torch.zeros_like(scale)
    scale = ((hi - lo) / 15).clamp(min=eps)
    return scale, (-8 - lo / scale).round().clamp(-8, 7)


def _fake_quant(w: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = (w / scale.unsqueeze(-1) + zp.unsqueeze(-1)).round().clamp(-8, 7)
    return q, (q - zp.unsqueeze(-1)) * scale.unsqueeze(-1)


def quantize_weight(
    w_NK: torch.Tensor,
    group_size: int = 128,
    symmetric: bool = True,
    mse: bool = True,
    scale_dtype: torch.dtype | None = None,
) -> Int4Tensors:
    """Group-wise int4 with the compressed-tensors scale rules, optionally with an MSE range search.

    symmetric: scale = max|w| / 7.5, so -max maps to -8 and +max to 7.5 (clamped to 7: the error is still at
    most half a step). asymmetric: scale = (max - min) / 15 with min <= 0 <= max so 0 is exact, zero_point =
    round(-8 - min / scale) in [-8, 7]. With `mse` (llm-compressor's "mse" observer does the same) each group
    also tries the range shrunk by the factors in MSE_GRID and keeps the one with the least squared error:
    clipping a few outliers buys a finer step for all the other weights of the group. `scale_dtype`: the dtype
    the scales will be stored in; they are rounded to it before `q` is computed, so `q` fits the stored scale.
    """
    if w_NK.ndim != 2:
        raise ValueError(f"quantize_weight expects a 2-D weight, got shape {tuple(w_NK.shape)}")
    if group_size <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    n, k = w_NK.shape
    groups = -(-k // group_size)
    w = F.pad(w_NK.float(), (0, groups * group_size - k)).view(n, groups, group_size)
    lo = w.amin(-1).clamp(max=0)
    hi = w.amax(-1).clamp(min=0)
    scale, zp = _qparams(lo, hi, symmetric)
    if mse:
        best = (_fake_quant(w, scale, zp)[1] - w).pow(2).sum(-1)
        for p in MSE_GRID[1:]:
            s_p, z_p = _qparams(lo * p, hi * p, symmetric)
            err = (_fake_quant(w, s_p, z_p)[1] - w).pow(2).sum(-1)
            better = err < best
            best = torch.where(better, err, best)
            scale, zp = torch.where(better, s_p, scale), torch.where(better, z_p, zp)
    if scale_dtype is not None:
        scale = scale.to(scale_dtype).float().clamp(min=torch.finfo(scale_dtype).tiny)
    q = _fake_quant(w, scale, zp)[0]
    q = q.view(n, groups * group_size)[:, :k].to(torch.int8)
    scale = scale if scale_dtype is None else scale.to(scale_dtype)
    return Int4Tensors(q, scale, None if symmetric else zp.to(torch.int8), group_size)


def dequantize_weight(t: Int4Tensors, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`w = (q - zero_point) * scale` per group -> [N, K] in `dtype` (the plain path's matrix)."""
    n, k = t.q.shape
    gs = t.group_size
    groups = -(-k // gs)
    q = F.pad(t.q, (0, groups * gs - k)).view(n, groups, gs).to(dtype)
    if t.zero_point is not None:
        q = q - t.zero_point.to(dtype).unsqueeze(-1)
    return (q * t.scale.to(dtype).unsqueeze(-1)).view(n, groups * gs)[:, :k]


def fake_quantize_weight(
    w_NK: torch.Tensor, group_size: int = 128, symmetric: bool = True, mse: bool = True
) -> torch.Tensor:
    """The weight an INT4 checkpoint of `w_NK` multiplies by: dequantize(quantize(w)) in w's dtype, with the
    scales stored as `quantize_checkpoint` and `Int4Linear.from_linear` store them. QAT (finetune/qat.py)
    trains through this very function, so trained and served numerics cannot drift apart."""
    t = quantize_weight(w_NK, group_size, symmetric, mse, scale_dtype=scale_dtype_for(w_NK.dtype))
    return dequantize_weight(t, w_NK.dtype)


def scale_dtype_for(weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype an INT4 layer of a `weight_dtype` weight stores its scales in: public W4A16 checkpoints store
    them in the compute dtype; fp32 models keep fp32 scales."""
    return weight_dtype if weight_dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.bfloat16
