"""The ops the network calls, each with its one implementation choice: `impl="torch"` runs the plain-PyTorch
reference (model/kernels/reference.py); `impl="fused"` runs the fused CPU kernel where it applies and the
reference elsewhere (a GPU, bf16, autograd, a layout the kernel does not take, a kernel that failed its probe).
The two give the same bits (the probes check it before a kernel is used, tests check the ops), so the choice
changes speed, never a result. `impl=None` (what the network passes) is the process's choice: `set_impl`, or
the `use(impl)` context; "fused" by default.

Shapes as in the network files: B batch, t query rows of a block, s keys, H heads, K top-k.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from model.kernels import fused, reference

IMPLS = ("torch", "fused")
_impl = "fused"


def set_impl(impl: str) -> None:
    """Every op's implementation from now on: 'torch' (the reference) or 'fused'."""
    global _impl
    if impl not in IMPLS:
        raise ValueError(f"kernel impl must be one of {IMPLS}, got {impl!r}")
    _impl = impl


@contextmanager
def use(impl: str) -> Iterator[None]:
    """`set_impl(impl)` inside the block, the previous choice after it."""
    before = _impl
    set_impl(impl)
    try:
        yield
    finally:
        set_impl(before)


def fused_on(impl: str | None = None) -> bool:
    """Whether `impl` (None: the process's choice) is 'fused'."""
    return (impl or _impl) == "fused"


_fused = fused_on


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, impl: str | None = None) -> torch.Tensor:
    """RMSNorm's inference path: fp32 math, cast back to x's dtype before the scale."""
    y = fused.rms_norm(x, weight, eps) if _fused(impl) else None
    return y if y is not None else reference.rms_norm(x, weight, eps)


def add_rms_norm(a, h, weight, eps: float, impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum into `a` (in place) and its RMSNorm."""
    out = fused.add_rms_norm(a, h, weight, eps) if _fused(impl) else None
    return out if out is not None else reference.add_rms_norm(a, h, weight, eps)


def rope(x, cos, sin, rotary: int | None = None, impl: str | None = None) -> torch.Tensor:
    """Interleaved-pair RoPE on the first `rotary` values of x's last dim (all by default), de-interleaved; the
    rest of the dim follows unchanged."""
    out = fused.rope(x, cos, sin, rotary) if _fused(impl) else None
    if out is not None:
        return out
    if rotary is None or rotary == x.shape[-1]:
        return reference.rope(x, cos, sin)
    return torch.cat([reference.rope(x[..., :rotary], cos, sin), x[..., rotary:]], dim=-1)


def concat_heads(a, b, scale: float | None = None, impl: str | None = None) -> torch.Tensor:
    """[a | b] along the last dim (b broadcast over a's heads), times `scale` if given."""
    out = fused.concat_heads(a, b, scale) if _fused(impl) else None
    return out if out is not None else reference.concat_heads(a, b, scale)


def attn_bias(topk, q_idx, s_end: int, n_keys: int, dtype=torch.float32, impl: str | None = None) -> torch.Tensor:
    """Additive 0 / -inf mask of a query block: key s visible to query t iff s <= q_idx[..., t] and, with topk
    [B, t, K], s is among its picks. -> [t, s_end] (one sequence, or no picks) or [B, t, s_end]."""
    one = q_idx.dim() == 1 and (topk is None or topk.shape[0] == 1)
    if _fused(impl) and one and dtype == torch.float32:
        out = fused.attn_bias(None if topk is None else topk[0], q_idx, s_end)
        if out is not None:
            return out
    return reference.attn_bias(topk, q_idx, s_end, n_keys=n_keys, dtype=dtype)


def softmax_bias(x: torch.Tensor, bias: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """softmax(x + bias) over the last dim, in place on x."""
    out = fused.softmax_bias(x, bias) if _fused(impl) else None
    return out if out is not None else reference.softmax_bias(x, bias)


def attend(q, k, v, bias, out, impl: str | None = None) -> torch.Tensor:
    """Masked attention of a query block, every head: q [B, t, H, d], k [B, s, H, d], v [B, s, H, dv], bias [t, s]
    (shared by the sequences) or [B, t, s] -> out [B, t, H, dv] (written in place) = softmax(q k^T + bias) v per
    sequence and head. One sequence on CPU: head by head in one fused call (a head's scores stay in cache)."""
    if _fused(impl) and q.shape[0] == 1:
        b2 = bias if bias.dim() == 2 else bias[0]
        if fused.attend_heads(q[0], k[0], v[0], b2, out[0]) is not None:
            return out
    return reference.attend(q, k, v, bias, out, softmax_bias=lambda x, b: softmax_bias(x, b, impl))


def mul_rows(x, u, w=None, impl: str | None = None) -> torch.Tensor:
    """x *= u, then x *= w (one weight per row), in place."""
    out = fused.mul_rows(x, u, w) if _fused(impl) else None
    return out if out is not None else reference.mul_rows(x, u, w)


def silu_mul(x, u, w=None, impl: str | None = None) -> torch.Tensor:
    """SwiGLU's activation in place on x: silu(x) * u (* w, one weight per row of 2-D x)."""
    if _fused(impl) and fused.silu_mul(x, u, w) is not None:
        return x
    return mul_rows(F.silu(x, inplace=True), u, w, impl)


def index_scores(q, k, w, impl: str | None = None) -> torch.Tensor:
    """DSA index scores, scale folded into w: q [B, T, I, d], k [B, S, d], w [B, T, I] (all fp32) -> [B, T, S]
    = sum_i w[b, t, i] * relu(q[b, t, i] . k[b, s]). One sequence on CPU: a block of queries at a time."""
    if _fused(impl) and q.shape[0] == 1:
        out = fused.index_scores(q[0], k[0], w[0])
        if out is not None:
            return out[None]
    return reference.index_scores(q, k, w)


def topk_indices(x: torch.Tensor, k: int, impl: str | None = None) -> torch.Tensor:
    """Indices of the k largest values along the last dim, in no particular order: the set torch.topk picks."""
    out = fused.topk_indices(x, k) if _fused(impl) else None
    return out if out is not None else x.topk(k, dim=-1, sorted=False).indices


def moe_experts(x, token, w, counts, gate_up, down, out, swiglu, impl: str | None = None) -> torch.Tensor:
    """A MoE layer's routed experts over (token, expert) pairs sorted by expert, added into out [N, D] in place
    (see reference.moe_experts); `swiglu(g, u, w)` is the activation the reference applies."""
    if _fused(impl) and fused.moe_experts(x, token, w, counts, gate_up, down, out) is not None:
        return out
    return reference.moe_experts(x, token, w, counts, gate_up, down, out, swiglu=swiglu)
