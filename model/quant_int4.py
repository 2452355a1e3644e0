"""INT4 weight-only quantization: group-wise int4 weights, activations in the compute dtype (W4A16).

`quantize_int4(model, group_size=128)` swaps every `nn.Linear` not matched by `skip` for an `Int4Linear`,
the way gpt-fast's `quantize.py` does: the model code stays written for full-precision weights.

Numerics (shared with the compressed-tensors checkpoint format, `model/compressed_tensors.py`): each row of
`W [N, K]` is cut into groups of `group_size` input columns; a group stores int4 `q` in [-8, 7], a scale and
(asymmetric only) an int4 zero point, and `w = (q - zero_point) * scale`.

Two implementations, chosen by `impl`:
- "fast": an int4 kernel, its weight layout built at swap time and never saved. On CPU one of two, chosen per
  machine when the layer is built (`model.kernels.int4.cpu_kernel`): our own ("glm5", model/kernels/cpu_int4.c:
  fp32 in and out, each weight decoded once per 4 input rows) where the CPU's best vector code is AVX2 and the
  layer is fp32 and symmetric, else torch's tinygemm ("tinygemm", below). On CUDA torch's tinygemm.
  Tinygemm: `aten._weight_int4pack_mm_for_cpu` on CPU, `aten._weight_int4pack_mm` on CUDA.
  The kernels compute `x @ ((u - 8) * s + z)^T` with unsigned `u = q + 8` and `(s, z)` pairs stored as
  `scales_and_zeros [G, N, 2]`, so our `(q - zp) * scale` maps to `s = scale, z = -zp * scale`; symmetric is
  `z = 0`. They run in bf16: the CPU kernel also accepts fp32 activations but its fp32 path is unvectorised
  (about 30x slower than bf16 in torch 2.13), so fp32 inputs are cast to bf16 and the output cast back.
- "plain": unpack, dequantise to the input's dtype, `F.linear`. The reference the fast path is tested against;
  its buffers are exactly the checkpoint tensors (`weight_packed`, `weight_scale`, `weight_shape`,
  `weight_zero_point`), so a plain module's `state_dict()` is its compressed-tensors checkpoint entry.

What stays in high precision follows GLM-5's FP8 checkpoint (reference glm5-model.md §2): embeddings and norms
(not `nn.Linear`, never touched), `lm_head`, the MoE router `mlp.gate`, the MTP `eh_proj` and the DSA indexer's
`weights_proj`; plus the indexer's `wk`, which vLLM fuses with `weights_proj` into an unquantized layer.
`DEFAULT_SKIP` lists them as regexes; pass your own `skip` to change it.

Shape legend: B = leading dims of the input flattened, N = out_features, K = in_features,
G = K / group_size groups, Np = N padded to the kernel's multiple.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model.compressed_tensors import (
    CompressedTensorsError,
    Int4Scheme,
    Int4Tensors,
    QuantizationConfig,
    compress,
    decompress,
    packed_modules,
    write_quantized_checkpoint,
)
from model.kernels import int4 as int4_kernel

# Regexes (re.search on the full module name) of linears kept in high precision, after GLM-5-FP8's split.
DEFAULT_SKIP: tuple[str, ...] = (
    r"(^|\.)lm_head$",
    r"(^|\.)mlp\.gate$",  # MoE router: scores are sigmoid-ed and top-k'd, keep them exact
    r"(^|\.)indexer\.weights_proj$",  # DSA indexer head weights (BF16 even in GLM-5-FP8)
    # FP8 in GLM-5-FP8, but vLLM fuses wk + weights_proj into one *unquantized* wk_weights_proj (it upcasts
    # FP8 wk to BF16 on load), so an int4 wk would make the checkpoint unloadable there. 0.8M params a layer.
    r"(^|\.)indexer\.wk$",
    r"(^|\.)eh_proj$",  # MTP input projection (BF16 in GLM-5-FP8)
    r"(^|\.)shared_head\.head$",
)
GROUP_SIZES = (32, 64, 128, 256)  # what the tinygemm kernels accept
IMPLS = ("fast", "plain")
_CPU_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu needs N % 16 == 0
_CUDA_N_MULTIPLE = 8
_CPU_INNER_K_TILES = 2  # ignored by the CPU packer's layout, kept for the signature


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
    t = quantize_weight(w_NK, group_size, symmetric, mse, scale_dtype=_scale_dtype(w_NK.dtype))
    return dequantize_weight(t, w_NK.dtype)


class Int4Linear(nn.Module):
    """A linear layer with group-wise int4 weights (see the module docstring for the two `impl`s)."""

    def __init__(
        self,
        t: Int4Tensors,
        bias: torch.Tensor | None = None,
        impl: str = "fast",
        scale_dtype: torch.dtype = torch.bfloat16,
        compute_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.out_features, self.in_features = t.q.shape
        self.group_size = t.group_size
        self.symmetric = t.zero_point is None
        self.impl = impl
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        # The dtype the layer computes in (the replaced linear's); what dense_weight() returns.
        self.compute_dtype = compute_dtype or _scale_dtype(t.scale.dtype)
        self._dense: torch.Tensor | None = None
        self.cpu_kernel: str | None = None  # fast on CPU: "glm5" or "tinygemm" (model/kernels/int4.py)
        if impl == "plain":
            for name, tensor in compress(t, scale_dtype).items():
                self.register_buffer(name, tensor)
            self._device_type = None
        else:
            self._build_fast(t)

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group_size: int = 128, symmetric: bool = True, impl: str = "fast", mse: bool = True
    ) -> Int4Linear:
        """Quantize an `nn.Linear` (see `quantize_weight`); the new module lives on the linear's device."""
        dt = _scale_dtype(linear.weight.dtype)
        t = quantize_weight(linear.weight.detach(), group_size, symmetric, mse, scale_dtype=dt)
        return cls(t, linear.bias, impl, scale_dtype=dt, compute_dtype=dt)

    @classmethod
    def from_checkpoint(
        cls,
        tensors: dict[str, torch.Tensor],
        scheme: Int4Scheme,
        impl: str = "fast",
        where: str = "",
        compute_dtype: torch.dtype | None = None,
    ) -> Int4Linear:
        """Build from one module's compressed-tensors tensors (`weight_packed`, `weight_scale`, ...)."""
        t = decompress(tensors, scheme, where)
        bias = tensors.get("bias")
        if bias is not None and compute_dtype is not None:
            bias = bias.to(compute_dtype)
        return cls(t, bias, impl, scale_dtype=t.scale.dtype, compute_dtype=compute_dtype)

    def _build_fast(self, t: Int4Tensors) -> None:
        n, k = t.q.shape
        gs = t.group_size
        dev = t.q.device
        if gs not in GROUP_SIZES:
            raise ValueError(f"the int4 kernels take group_size in {GROUP_SIZES}, got {gs}; use impl='plain'")
        if k % gs:
            raise ValueError(f"in_features {k} is not a multiple of group_size {gs}; use impl='plain' or skip it")
        if dev.type == "cuda" and k % 32:
            raise ValueError(f"in_features {k} must be a multiple of 32 for the CUDA int4 kernel; use impl='plain'")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"no int4 kernel for device {dev}; use impl='plain'")
        self._device_type = dev.type
        if dev.type == "cpu":
            self.cpu_kernel = int4_kernel.cpu_kernel(t.zero_point is None, gs, self.compute_dtype)
            if self.cpu_kernel == "glm5":
                w, s = int4_kernel.repack(t.q, t.scale)
                self.register_buffer("int4_w", w, persistent=False)
                self.register_buffer("int4_s", s, persistent=False)
                self._cpu_hot = False
                self._glm5 = True  # forward's inlined path
                return
        mult = _CPU_N_MULTIPLE if dev.type == "cpu" else _CUDA_N_MULTIPLE
        n_pad = -(-n // mult) * mult
        # Padded rows are q=0 with scale 0: they produce zeros, sliced off after the matmul.
        u_NpK = F.pad(t.q.to(torch.int32) + 8, (0, 0, 0, n_pad - n), value=8)
        scale = F.pad(t.scale.float(), (0, 0, 0, n_pad - n))  # [Np, G]
        zp = torch.zeros_like(scale) if t.zero_point is None else F.pad(t.zero_point.float(), (0, 0, 0, n_pad - n))
        sz_GNp2 = torch.stack([scale, -zp * scale], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        if dev.type == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u_NpK, _CPU_INNER_K_TILES)
        else:
            # CUDA takes [N, K/2] uint8, even column in the high nibble; innerKTiles needs K % (16 * it) == 0.
            u8 = (u_NpK[:, ::2] << 4 | u_NpK[:, 1::2]).to(torch.uint8)
            inner = next(it for it in (8, 4, 2) if k % (16 * it) == 0)
            packed = torch.ops.aten._convert_weight_to_int4pack(u8, inner)
        # Kernel layouts depend on device and ISA: rebuilt from the checkpoint, never saved.
        self.register_buffer("int4pack", packed, persistent=False)
        self.register_buffer("scales_and_zeros", sz_GNp2, persistent=False)
        self._glm5 = False
        # forward's inlined path: CPU kernel, nothing to slice off or add
        self._cpu_hot = dev.type == "cpu" and n_pad == n and self.bias is None

    # -- forward --------------------------------------------------------------------------------------------

    # -- a LoRA adapter on top, in full precision --------------------------------------------------------------

    def set_low_rank(self, a_RK: torch.Tensor | None, b_NR: torch.Tensor | None = None) -> None:
        """Serve `W_int4 x + B (A x)`: an adapter's factors (B already scaled by alpha / r) beside the int4 weight,
        in the layer's compute dtype, instead of merged into it. Merging and quantizing anew would round every
        weight again, moving them further than a small adapter (an RL run's) does; beside it, the served change
        is exactly the adapter's. None removes it."""
        self._dense = None
        if a_RK is None:
            self.__dict__.pop("low_rank", None)
            return
        if a_RK.shape[1] != self.in_features or b_NR.shape != (self.out_features, a_RK.shape[0]):
            raise ValueError(
                f"low-rank factors A {tuple(a_RK.shape)}, B {tuple(b_NR.shape)} do not fit a "
                f"{self.out_features} x {self.in_features} layer"
            )
        dev = next(self.buffers()).device
        self.__dict__["low_rank"] = (a_RK.to(dev, self.compute_dtype), b_NR.to(dev, self.compute_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._forward_int4(x)
        low = self.__dict__.get("low_rank")
        return y if low is None else _add_low_rank(y, x, low)

    def _forward_int4(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Int4Linear expects last dim {self.in_features}, got {tuple(x.shape)}")
        if self.__dict__.get("_cpu_hot") and x.dim() == 2 and x.device.type == "cpu":
            # The decode hot path (fast, CPU, no bias, no padded rows, 2-D input): `_forward_fast` inlined, since
            # a decode step makes ~20 of these calls per layer and each pays its Python.
            b = self._buffers
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16), b["int4pack"], self.group_size, b["scales_and_zeros"]
            )
            return y.to(x.dtype)
        if self.__dict__.get("_glm5") and x.device.type == "cpu" and not (x.requires_grad and torch.is_grad_enabled()):
            # Our CPU kernel: fp32 in and out, bias added in the kernel (`_forward_fast`, inlined for decode).
            b = self._buffers
            x_BK = x if x.dim() == 2 else x.reshape(-1, self.in_features)
            y = int4_kernel.linear(x_BK.float(), b["int4_w"], b["int4_s"], self.out_features, self.group_size,
                                   None if self.bias is None else self.bias.float())  # fmt: skip
            return (y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)).to(x.dtype)
        if self.__dict__.get("_glm5"):  # autograd through x (the kernel has no backward): the dense weight's
            return F.linear(x, self.dequantize(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        y = self._forward_fast(x) if self.impl == "fast" else self._forward_plain(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _forward_plain(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantize(x.dtype))

    def _forward_fast(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != self._device_type:
            raise RuntimeError(
                f"Int4Linear was packed for {self._device_type} but got input on {x.device.type}: "
                "move the model to its device before quantize_int4 / loading"
            )
        if self.__dict__.get("_glm5"):
            x_BK = x.reshape(-1, self.in_features).float()
            y = int4_kernel.linear(x_BK, self.int4_w, self.int4_s, self.out_features, self.group_size)
            return y.view(*x.shape[:-1], self.out_features).to(x.dtype)
        # Decode calls this ~20 times per layer per token, so skip the no-op reshapes and slices.
        x_BK = (x if x.dim() == 2 else x.reshape(-1, self.in_features)).to(torch.bfloat16)
        if self._device_type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x_BK, self.int4pack, self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm(x_BK, self.int4pack, self.group_size, self.scales_and_zeros)
        if y.shape[1] != self.out_features:  # N padded for the kernel
            y = y[:, : self.out_features]
        if x.dim() != 2:
            y = y.reshape(*x.shape[:-1], self.out_features)
        return y.to(x.dtype)

    # -- inspection -----------------------------------------------------------------------------------------

    def int4_tensors(self) -> Int4Tensors:
        """The quantized weight in unpacked form (plain modules; fast modules keep only the kernel layout)."""
        if self.impl != "plain":
            raise RuntimeError("int4_tensors() needs impl='plain': the fast layout is kernel-private")
        scheme = Int4Scheme(self.group_size, self.symmetric)
        return decompress(dict(self.named_buffers()), scheme)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The full-precision weight `[N, K]` that this module multiplies by."""
        if self.impl == "plain":
            return dequantize_weight(self.int4_tensors(), dtype)
        # The kernel applied to the identity returns W^T exactly (each output is one weight, in bf16 for
        # tinygemm, in fp32 for ours).
        dt = torch.float32 if self.__dict__.get("_glm5") else torch.bfloat16
        eye = torch.eye(self.in_features, dtype=dt, device=next(self.buffers()).device)
        return self._forward_fast(eye).t().to(dtype)

    def dense_weight(self) -> torch.Tensor:
        """The dequantized weight in the compute dtype, for code that reads the matrix itself rather than calling
        the layer (MLA weight absorption reads kv_b_proj's). Built once and kept: such a layer then holds a
        dense copy too, which `weight_bytes()` counts."""
        if self._dense is None:
            self._dense = self.dequantize(self.compute_dtype)
            low = self.__dict__.get("low_rank")
            if low is not None:
                self._dense = self._dense + low[1] @ low[0]
        return self._dense

    def weight_bytes(self) -> int:
        """Bytes of weight storage: packed int4 + scales (+ zero points), bias excluded."""
        dense = 0 if self._dense is None else self._dense.numel() * self._dense.element_size()
        return dense + sum(b.numel() * b.element_size() for n, b in self.named_buffers() if n != "weight_shape")

    def extra_repr(self) -> str:
        sym = "symmetric" if self.symmetric else "asymmetric"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
            f"{sym}, impl={self.impl}{'' if self.cpu_kernel is None else f' ({self.cpu_kernel})'}, "
            f"bias={self.bias is not None}"
        )


def _add_low_rank(y: torch.Tensor, x: torch.Tensor, low: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """y + B (A x), in y's dtype."""
    a, b = low
    return y + F.linear(F.linear(x.to(a.dtype), a), b).to(y.dtype)


def _scale_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    # Public W4A16 checkpoints store scales in the compute dtype; fp32 models keep fp32 scales.
    return weight_dtype if weight_dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.bfloat16


def is_skipped(name: str, skip: Iterable[str]) -> bool:
    """Whether the module `name` stays in high precision under the regexes `skip`."""
    return any(re.search(p, name) for p in skip)


def quantize_int4(
    model: nn.Module,
    group_size: int = 128,
    symmetric: bool = True,
    skip: Iterable[str] = DEFAULT_SKIP,
    impl: str = "fast",
    strict: bool = True,
    mse: bool = True,
) -> nn.Module:
    """Swap every `nn.Linear` of `model` whose name no `skip` regex matches for an `Int4Linear`, in place.

    Move the model to its device first: the fast layout is built for the device the weights are on.
    Returns the model. A linear whose in_features is not a multiple of `group_size` raises a ValueError naming
    it, or with `strict=False` stays in high precision (as `quantize_checkpoint` does).
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    targets = _targets(model, group_size, skip, strict)
    for name, mod in targets:
        if mod.in_features % group_size:
            raise ValueError(
                f"{name}: in_features {mod.in_features} is not a multiple of group_size {group_size}; "
                "pick a smaller group size or add the layer to skip"
            )
    for name, mod in targets:
        set_submodule(model, name, Int4Linear.from_linear(mod, group_size, symmetric, impl, mse))
    fuse_gate_up(model)
    return model


def _targets(model: nn.Module, group_size: int, skip: Iterable[str], strict: bool) -> list[tuple[str, nn.Linear]]:
    """The linears `quantize_int4` swaps: not skipped (with strict=False, only those it can group)."""
    skip = tuple(skip)
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and not isinstance(mod, Int4Linear) and not is_skipped(name, skip)
    ]
    return targets if strict else [(name, mod) for name, mod in targets if mod.in_features % group_size == 0]


@torch.no_grad()
def round_like_int4(model: nn.Module, group_size: int = 128, skip: Iterable[str] = DEFAULT_SKIP) -> list[str]:
    """Replace, in place, the weight of every linear `quantize_int4(model, group_size, strict=False)` would swap
    with the weight its Int4Linear multiplies by (`fake_quantize_weight`), in full precision: a model that
    computes what the INT4-served one does, and can still be trained. `glm5 finetune rl --quant int4` trains a
    LoRA adapter on top of it, the adapter served beside the int4 weights. -> the names rounded."""
    names = []
    for name, mod in _targets(model, group_size, skip, strict=False):
        mod.weight.copy_(fake_quantize_weight(mod.weight, group_size, symmetric=True, mse=True))
        names.append(name)
    return names


class Int4GateUp:
    """An MLP's gate_proj and up_proj (fast Int4Linears reading the same input) in one kernel call: half the
    calls, input conversions and dispatch of a SwiGLU at decode, where each call costs ~4.5 us before any
    arithmetic (measured: 2 x 13.9 us for two 256 x 768 calls, 23.1 us for one 512 x 768). The two modules'
    packed weights become row views of one buffer, so nothing is stored twice but their scales (a few KB, which
    the kernel needs contiguous); the result is bit-identical to the two calls. Kept on the MLP as a plain
    attribute (not in its state_dict); `current` tells whether it still matches the MLP's modules."""

    # The CPU packer lays rows out in blocks of 64: concatenating two packs is the pack of the concatenated
    # weights only when the first has whole blocks (measured; `fuse_gate_up` also checks the result). Our own
    # kernel's blocks of 16 rows are independent, padded rows included, so its packs always concatenate.
    ROW_BLOCK = 64

    def __init__(self, gate: Int4Linear, up: Int4Linear):
        self.gate, self.up = gate, up
        self.glm5 = gate.cpu_kernel == "glm5"
        if self.glm5:
            self.split = gate.int4_w.shape[0] * int4_kernel.BLOCK  # the gate's rows as packed (padded to 16)
            self.pack = torch.cat([gate.int4_w, up.int4_w])
            self.scales_and_zeros = torch.cat([gate.int4_s, up.int4_s])
            return
        self.split = gate.int4pack.shape[0]  # the gate's rows as packed (the kernel pads N)
        self.pack = torch.cat([gate.int4pack, up.int4pack])
        self.scales_and_zeros = torch.cat([gate.scales_and_zeros, up.scales_and_zeros], dim=1).contiguous()

    def share_storage(self) -> None:
        """Make the two modules' packed weights row views of the pair's buffer (frees their own copies)."""
        if self.glm5:
            blocks = self.gate.int4_w.shape[0]
            self.gate.int4_w, self.up.int4_w = self.pack[:blocks], self.pack[blocks:]
            return
        self.gate.int4pack, self.up.int4pack = self.pack[: self.split], self.pack[self.split :]

    @staticmethod
    def applies(gate, up) -> bool:
        return (
            isinstance(gate, Int4Linear)
            and isinstance(up, Int4Linear)
            and gate.impl == up.impl == "fast"
            and gate._device_type == up._device_type == "cpu"
            and gate.cpu_kernel == up.cpu_kernel
            and gate.bias is None
            and up.bias is None
            and (gate.in_features, gate.group_size) == (up.in_features, up.group_size)
            and (
                gate.cpu_kernel == "glm5"
                or gate.scales_and_zeros.dtype == up.scales_and_zeros.dtype
                and gate.int4pack.shape[0] % Int4GateUp.ROW_BLOCK == 0
            )
        )

    def current(self, mlp) -> bool:
        mods = mlp._modules
        return (
            mods["gate_proj"] is self.gate
            and mods["up_proj"] is self.up
            and (self.gate.int4_w if self.glm5 else self.gate.int4pack).data_ptr() == self.pack.data_ptr()
        )

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (gate_proj(x), up_proj(x)) in x's dtype."""
        x_BK = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if self.glm5:
            n = self.split + self.up.out_features
            y = int4_kernel.linear(x_BK.float(), self.pack, self.scales_and_zeros, n, self.gate.group_size)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x_BK.to(torch.bfloat16), self.pack, self.gate.group_size, self.scales_and_zeros
            )
        g, u = y[:, : self.gate.out_features], y[:, self.split : self.split + self.up.out_features]
        if self.glm5 and x.dtype == torch.float32:
            # Contiguous, as the two calls' outputs are (tinygemm's get that from the cast to x's dtype): torch's
            # element-wise ops walk a strided view row by row, a contiguous tensor as one run, and their vector
            # and scalar tails round differently, so the SwiGLU after this would not give the two calls' bits.
            g, u = g.contiguous(), u.contiguous()
        if x.dim() != 2:
            g, u = g.reshape(*x.shape[:-1], -1), u.reshape(*x.shape[:-1], -1)
        g, u = g.to(x.dtype), u.to(x.dtype)
        low_g, low_u = self.gate.__dict__.get("low_rank"), self.up.__dict__.get("low_rank")
        return (g if low_g is None else _add_low_rank(g, x, low_g)), (
            u if low_u is None else _add_low_rank(u, x, low_u)
        )


def fuse_gate_up(model: nn.Module) -> int:
    """`Int4GateUp` for every MLP whose gate_proj and up_proj are fast CPU Int4Linears. -> how many."""
    n = 0
    for mod in model.modules():
        gate, up = getattr(mod, "gate_proj", None), getattr(mod, "up_proj", None)
        if not Int4GateUp.applies(gate, up):
            continue
        pair = Int4GateUp(gate, up)
        probe = torch.randn(2, gate.in_features, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            g, u = pair(probe)
            if not (torch.equal(g, gate(probe)) and torch.equal(u, up(probe))):
                continue  # a kernel layout this pairing does not know: keep the two calls
        pair.share_storage()
        mod.int4_gate_up = pair
        mod.forward = types.MethodType(_paired_forward, mod)  # this MLP's own forward; its class is untouched
        n += 1
    return n


def _paired_forward(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The forward `fuse_gate_up` gives an MLP: gate and up in one kernel call while the pair still matches its
    modules and nothing trains, else the MLP's own forward."""
    pair = mlp.__dict__["int4_gate_up"]
    if torch.is_grad_enabled() or not pair.current(mlp):
        return type(mlp).forward(mlp, x)
    g, u = pair(x)
    return mlp.down_proj(F.silu(g) * u)


def set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule at dotted `name` (works for ModuleList indices too)."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Weight storage of a model by kind: `int4` (Int4Linear buffers incl. scales) and `dense` (parameters)."""
    int4 = sum(m.weight_bytes() for m in model.modules() if isinstance(m, Int4Linear))
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"int4": int4, "dense": dense, "total": int4 + dense}


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
        return quantize_weight(w, group_size, symmetric, mse, scale_dtype=_scale_dtype(w.dtype))

    return write_quantized_checkpoint(
        src,
        out,
        quantize_fn,
        classify,
        Int4Scheme(group_size, symmetric, observer="mse" if mse else "minmax"),
        progress=progress,
    )


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
    from model.compressed_tensors import read_quantization_config, read_tensors

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
