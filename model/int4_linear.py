"""`Int4Linear`: a linear layer with group-wise int4 weights, activations in the compute dtype (W4A16).

The weights are those of model/int4_numerics.py (`w = (q - zero_point) * scale` per group of input columns).
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

Which linears of a model become `Int4Linear`s is model/quant_int4.py's business (the swap), and how they are
read from a checkpoint model/int4_load.py's; a pair of them can run as one kernel call (model/int4_gate_up.py).

Shape legend: B = leading dims of the input flattened, N = out_features, K = in_features,
G = K / group_size groups, Np = N padded to the kernel's multiple.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.compressed_tensors import Int4Scheme, Int4Tensors, compress, decompress
from model.int4_numerics import dequantize_weight, quantize_weight, scale_dtype_for
from model.kernels import int4 as int4_kernel

GROUP_SIZES = (32, 64, 128, 256)  # what the tinygemm kernels accept
IMPLS = ("fast", "plain")
_CPU_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu needs N % 16 == 0
_CUDA_N_MULTIPLE = 8
_CPU_INNER_K_TILES = 2  # ignored by the CPU packer's layout, kept for the signature


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
        self.compute_dtype = compute_dtype or scale_dtype_for(t.scale.dtype)
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
        dt = scale_dtype_for(linear.weight.dtype)
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
        return y if low is None else add_low_rank(y, x, low)

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


def add_low_rank(y: torch.Tensor, x: torch.Tensor, low: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """y + B (A x), in y's dtype."""
    a, b = low
    return y + F.linear(F.linear(x.to(a.dtype), a), b).to(y.dtype)
