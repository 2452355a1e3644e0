"""An MLP's gate_proj and up_proj, two fast CPU `Int4Linear`s reading the same input, run as one kernel call.

`fuse_gate_up(model)` pairs them wherever it applies (after `quantize_int4` and after loading an INT4
checkpoint) and gives that MLP a forward that uses the pair; the result is bit-identical to the two calls.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from model.int4_linear import Int4Linear, add_low_rank
from model.kernels import int4 as int4_kernel


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
        return (g if low_g is None else add_low_rank(g, x, low_g)), (u if low_u is None else add_low_rank(u, x, low_u))


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
