"""Fused CPU kernels for a prefill's element-wise passes, MoE experts, attention and indexer, compiled on first use.

A prefill on CPU spends most of its time in GEMMs, and much of the rest in element-wise passes that torch runs
one operation at a time, each reading the tensor and writing a fresh one: RMSNorm is five such passes. The
kernels here do the same arithmetic in one or two passes. They give the same bits as the torch code they
replace, which stays beside them as the reference (`torch_rms_norm`, ...): before a kernel is used, the loader
runs it and its reference on random rows of several lengths, and a kernel that differs in any bit is never
used. So a forward is the same function of its inputs with or without them, and a machine without a C
compiler, or with a torch whose summation order differs, just runs the reference.

Three kernels reorder GEMM work so that intermediates stay in cache, calling the very sgemm torch calls (MKL's,
inside libtorch_cpu) with the same arguments, so every value goes through the same operations:
- `moe_experts`: a MoE layer's routed experts, per expert: its tokens' rows gathered, its two GEMMs, the SwiGLU,
  the weighted scatter-add (instead of three [tokens * k, ...] tensors through memory);
- `attend_heads`: a query block's attention head by head (scores, masked softmax, weighted sum of values);
- `index_scores`: the DSA indexer's scores a block of queries at a time (logits, relu, weighted head sum).
The last relies on torch's BLAS giving each row of a product the same bits whatever the number of rows (from
32 rows up); the loader's probe checks that too.

Two sources: `cpu_kernels.c` (plain C: norms, RoPE, masks, copies, top-k) and `cpu_kernels_vec.cpp`, for
the ones that call exp or BLAS (the attention softmax, SwiGLU's SiLU, the three above). Those are written on
torch's own Vectorized types and linked against libtorch_cpu, so that exp is torch's exp. Each is compiled by the system's compiler
(`$CC` / `$CXX`, else `cc` / `c++`) for this CPU into a cache directory (`$GLM5_KERNEL_CACHE`, else
`~/.cache/glm5/kernels`) under a name that hashes the source, the command, torch's version and the CPU, and
loaded with ctypes (which releases the GIL during a call). Either may be missing; `GLM5_CPU_KERNELS=0` turns
both off.

Every entry point returns None when it does not apply (not CPU fp32, a layout it does not take, autograd on,
kernels unavailable): callers then run the reference. A call costs ~2 us before any work, which is still less
than the torch calls it replaces even for one row (7 vs 9 us for a 1 x 768 RMSNorm). Rows are split between
as many threads as torch uses, in torch's own OpenMP runtime, when a call has at least 32K values (a 512 x 768
RMSNorm: 0.15 ms on one thread, 0.08 ms on two; torch's five passes: 0.33 / 0.16 ms); the SiLU kernel stays on
one thread (see `silu_mul`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

_SRC = Path(__file__).with_name("cpu_kernels.c")
_SRC_VEC = Path(__file__).with_name("cpu_kernels_vec.cpp")
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")
# torch's CPU sum reads rows as vectors of this many floats (8 measured for torch 2.x on x86-64, AVX2 and
# AVX-512 builds alike); if the probe finds otherwise, the other width is tried.
_SUM_LANES = (8, 16)
# With OMP_WAIT_POLICY=PASSIVE, OpenMP's threads sleep between parallel regions and waking them costs ~0.1 ms a
# call (measured: a 512 x 768 RMSNorm on 2 threads takes 0.18 ms that way, 0.15 ms on one, 0.08 ms with the
# default policy), more than splitting one of these passes saves: the kernels then run on the calling thread.
_PASSIVE = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
# torch's at::internal::GRAIN_SIZE: element-wise kernels on more values than this are split between threads.
_GRAIN = 32768

_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float
_SIGNATURES = {
    "glm5_rms_norm": (_P, _I, _P, _P, _I, _I, _F),
    "glm5_add_rms_norm": (_P, _P, _P, _P, _P, _I, _I, _F),
    "glm5_rope": (_P, _I, _I, _P, _P, _P, _I, _I, _I, _I, _I, _I),
    "glm5_attn_bias": (_P, _I, _P, _I, _I, _P),
    "glm5_concat_heads": (_P, _I, _I, _I, _P, _I, _I, _I, _P, _I, _I, ctypes.c_int, _F),
    "glm5_mul_rows": (_P, _I, _P, _I, _P, _I, _I),
    "glm5_topk_set": (_P, _I, _I, _I, _I, _P, _P),
    "glm5_softmax_bias": (_P, _P, _I, _I, _I),
    "glm5_silu_mul": (_P, _I, _P, _I, _P, _I, _I),
    "glm5_moe_experts": (_P, _I, _P, _P, _P, _I, _P, _P, _I, _I, _P, _I, _P, _I, _I),
    "glm5_attend_heads": (_P, _I, _I, _P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _I, _I, _I, _I, _P),
    "glm5_index_scores": (_P, _I, _P, _I, _P, _P, _I, _I, _I, _I, _I, _P),
}
# Which source each kernel is in: plain C, or C++ on torch's vector math (the ones that call exp, and the MoE
# experts, which also call torch's BLAS).
_CPP = ("glm5_softmax_bias", "glm5_silu_mul", "glm5_moe_experts", "glm5_attend_heads", "glm5_index_scores")
_SOURCE_OF = {name: "cpp" if name in _CPP else "c" for name in _SIGNATURES}
_RESTYPES = {
    "glm5_topk_set": ctypes.c_int64,
    "glm5_moe_experts": ctypes.c_int,
    "glm5_attend_heads": ctypes.c_int,
    "glm5_index_scores": ctypes.c_int,
}

_lock = threading.Lock()
_state: dict[str, object] = {}  # "fns": {name: function} | None, "enabled": names that passed the probe, "note"


# ---- the references: what each kernel must equal, bit for bit ----------------------------------------------


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm's inference path in torch ops (fp32 math, cast back before the scale)."""
    x32 = x.float()
    y = x32 * x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    return y.to(x.dtype).mul_(weight)


def torch_add_rms_norm(
    a: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum into `a` (in place) and the RMSNorm of it."""
    s = a.add_(h)
    return s, torch_rms_norm(s, weight, eps)


def torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair RoPE on x's last dim, output de-interleaved (model/rope.py's `apply_rope`)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def torch_attn_bias(
    topk: torch.Tensor | None, q_idx: torch.Tensor, s_end: int, n_keys: int | None = None, dtype=torch.float32
) -> torch.Tensor:
    """Additive mask [..., t, s_end] of a block of queries (model/attention.py, `attend_expanded`): 0 where key
    s <= q_idx[..., t] (and s is among topk[..., t, :] when given), else -inf. q_idx [t] or [B, t]; topk
    [..., t, K] with every index below n_keys (default: found from topk)."""
    future = torch.arange(s_end, device=q_idx.device) > q_idx[..., None]
    if topk is None:
        return torch.zeros(future.shape, dtype=dtype, device=q_idx.device).masked_fill_(future, float("-inf"))
    width = max(s_end, n_keys if n_keys is not None else int(topk.max()) + 1)
    bias = torch.full((*topk.shape[:-1], width), float("-inf"), dtype=dtype, device=q_idx.device)
    return bias.scatter_(-1, topk, 0.0)[..., :s_end].masked_fill_(future, float("-inf"))


def torch_concat_heads(a: torch.Tensor, b: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """[a | b] along the last dim (b broadcast to a's leading shape), times `scale` if given."""
    out = torch.cat([a, b.expand(*a.shape[:-1], b.shape[-1])], dim=-1)
    return out if scale is None else out.mul_(scale)


def torch_mul_rows(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """x *= u, then x *= w (one weight per row), in place."""
    x = x.mul_(u)
    return x if w is None else x.mul_(w[:, None])


def torch_softmax_bias(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(x + bias) over the last dim, x updated in place by the sum (attention's masked softmax)."""
    return x.add_(bias).softmax(-1)


def torch_silu_mul(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's activation in place: x = silu(x) * u (* w, one weight per row)."""
    return torch_mul_rows(F.silu(x, inplace=True), u, w)


def torch_attend_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Masked attention of t queries over s keys, every head (model/attention.py, `attend_expanded` with one
    sequence): q [t, H, d], k [s, H, d], v [s, H, dv], bias [t, s] (0 / -inf, shared by the heads) ->
    out [t, H, dv] (written in place) = softmax(q_h k_h^T + bias) v_h per head."""
    scores = torch.bmm(q.transpose(0, 1), k.permute(1, 2, 0))  # [H, t, s]
    return torch.bmm(torch_softmax_bias(scores, bias), v.transpose(0, 1), out=out.transpose(0, 1)).transpose(0, 1)


def torch_index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The DSA indexer's scores (model/indexer.py, `Indexer.scores`, scale folded into w): q [T, I, d] queries,
    k [S, d] keys, w [T, I] head weights -> [T, S] = sum_i w[t, i] * relu(q[t, i] . k[s])."""
    T, I, d = q.shape
    logits = torch.bmm(q.reshape(1, T * I, d), k[None].transpose(1, 2)).relu_()
    return torch.matmul(w[:, None, :], logits.view(T, I, -1)).squeeze(1)


def torch_moe_experts(
    x: torch.Tensor,
    token: torch.Tensor,
    w: torch.Tensor,
    counts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    out: torch.Tensor,
    swiglu=torch_silu_mul,
) -> torch.Tensor:
    """The routed experts of a MoE layer over (token, expert) pairs sorted by expert (model/moe.py,
    `MoE.routed_stacked`): pair p is row token[p] of x [N, D] with routing weight w[p]; expert e owns the next
    counts[e] pairs; gate_up [E, D, 2I] and down [E, I, D] are the experts' stacked weights (input-major).
    out [N, D] += sum over pairs of w[p] * down_e(silu(gate_e(x)) * up_e(x)), in place, in pair order.
    `swiglu(g, u, w)` computes the activation (any function with torch_silu_mul's bits; the model's runs in place
    on g when nothing trains)."""
    offs = counts.cumsum(0).to(torch.int32)
    h = torch._grouped_mm(x.index_select(0, token), gate_up, offs=offs)  # [pairs, 2I]
    g, u = h.split(down.shape[1], dim=-1)
    return out.index_add_(0, token, torch._grouped_mm(swiglu(g, u, w), down, offs=offs))


# ---- the kernels ----------------------------------------------------------------------------------------


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """x as [rows, n] with unit stride along n and one stride between rows, or None."""
    try:
        x2 = x.view(-1, x.shape[-1])
    except RuntimeError:
        return None
    if x2.stride(1) != 1 and x2.shape[1] > 1:
        return None
    return x2, x2.stride(0)


def _kernel(name: str):
    """The kernel's function if it is built and passed its probe, else None."""
    fns = _load()
    if fns is None or name not in _state["enabled"]:
        return None
    threads = torch.get_num_threads() if not _PASSIVE else 1
    if threads != _state.get("threads"):  # the kernels split rows over as many threads as torch uses
        for set_threads in _state["set_threads"]:
            set_threads(threads)
        _state["threads"] = threads
    return fns.get(name)


def _usable(name: str, *tensors: torch.Tensor):
    """The kernel's function if it may run on these tensors (CPU fp32, no autograd), else None."""
    if torch.is_grad_enabled():
        return None
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    return _kernel(name)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """`torch_rms_norm(x, weight, eps)` in two passes per row, or None (see the module docstring)."""
    fn = _usable("glm5_rms_norm", x, weight)
    if fn is None or not weight.is_contiguous() or (r := _rows(x)) is None:
        return None
    x2, stride = r
    out = torch.empty(x.shape, dtype=x.dtype)
    fn(x2.data_ptr(), stride, weight.data_ptr(), out.data_ptr(), x2.shape[0], x2.shape[1], eps)
    return out


def add_rms_norm(
    a: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`torch_add_rms_norm`: a += h (in place), and the RMSNorm of the sum, in one pass per row; or None."""
    fn = _usable("glm5_add_rms_norm", a, h, weight)
    if fn is None or a.shape != h.shape or not (a.is_contiguous() and h.is_contiguous() and weight.is_contiguous()):
        return None
    n = a.shape[-1]
    out = torch.empty(a.shape, dtype=a.dtype)
    fn(a.data_ptr(), h.data_ptr(), a.data_ptr(), weight.data_ptr(), out.data_ptr(), a.numel() // n, n, eps)
    return a, out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int | None = None) -> torch.Tensor | None:
    """`torch_rope` on the first `rotary` values of x's last dim (all of them by default), the rest copied
    after them: [rope(x[..., :r]) | x[..., r:]], contiguous; or None.

    x [..., H, D] with cos/sin [..., 1, r/2] (one angle per position, shared by H heads), or x [..., D] with
    cos/sin [..., r/2]; the leading dims must match.
    """
    D = x.shape[-1]
    r = D if rotary is None else rotary
    fn = _usable("glm5_rope", x, cos, sin)
    if fn is None or r % 2 or x.stride(-1) != 1 or not (cos.is_contiguous() and sin.is_contiguous()):
        return None
    if cos.shape != sin.shape or cos.shape[-1] != r // 2:
        return None
    if cos.shape[:-1] == x.shape[:-1]:
        H = 1
    elif x.dim() >= 2 and cos.dim() == x.dim() and cos.shape[-2] == 1 and cos.shape[:-2] == x.shape[:-2]:
        H = x.shape[-2]
    else:
        return None
    try:
        x3 = x.view(-1, H, D)
    except RuntimeError:
        return None
    out = torch.empty(x.shape, dtype=x.dtype)
    P = x3.shape[0]
    fn(
        x3.data_ptr(),
        x3.stride(0),
        x3.stride(1),
        cos.data_ptr(),
        sin.data_ptr(),
        out.data_ptr(),
        H * D,
        D,
        P,
        H,
        r,
        D - r,
    )
    return out


def attn_bias(topk_tK: torch.Tensor | None, q_idx_t: torch.Tensor, s_end: int) -> torch.Tensor | None:
    """`torch_attn_bias` in one pass, contiguous fp32 [t, s_end]; or None."""
    if torch.is_grad_enabled() or q_idx_t.device.type != "cpu" or q_idx_t.dim() != 1:
        return None
    fn = _kernel("glm5_attn_bias")
    if fn is None:
        return None
    q_idx_t = q_idx_t.contiguous().to(torch.int64)
    K, topk_ptr = 0, None
    if topk_tK is not None:
        topk_tK = topk_tK.contiguous().to(torch.int64)
        K, topk_ptr = topk_tK.shape[-1], topk_tK.data_ptr()
    out = torch.empty(q_idx_t.shape[0], s_end)
    fn(topk_ptr, K, q_idx_t.data_ptr(), q_idx_t.shape[0], s_end, out.data_ptr())
    return out


def _heads(x: torch.Tensor) -> tuple[torch.Tensor, int, int] | None:
    """x [..., H, D] as [P, H, D] with unit stride in D: (view, position stride, head stride), or None."""
    if x.dim() < 2 or (x.stride(-1) != 1 and x.shape[-1] > 1):
        return None
    try:
        x3 = x.reshape(-1, *x.shape[-2:]) if x.dim() > 3 else x.view(-1, *x.shape[-2:])
    except RuntimeError:
        return None
    if x3.data_ptr() != x.data_ptr() and x.numel():
        return None  # reshape copied: the leading dims do not merge into one stride
    return x3, x3.stride(0), x3.stride(1)


def concat_heads(a: torch.Tensor, b: torch.Tensor, scale: float | None = None) -> torch.Tensor | None:
    """`torch_concat_heads` in one pass, for a [..., H, Da] and b [..., H or 1, Db]; or None."""
    fn = _usable("glm5_concat_heads", a, b)
    if fn is None or a.dim() != b.dim() or a.shape[:-2] != b.shape[:-2] or b.shape[-2] not in (1, a.shape[-2]):
        return None
    ha, hb = _heads(a), _heads(b)
    if ha is None or hb is None:
        return None
    (a3, a_ps, a_hs), (b3, b_ps, b_hs) = ha, hb
    H, Da, Db = a.shape[-2], a.shape[-1], b.shape[-1]
    b_hs = 0 if b.shape[-2] == 1 else b_hs
    out = torch.empty(*a.shape[:-1], Da + Db)
    fn(
        a3.data_ptr(), a_ps, a_hs, Da, b3.data_ptr(), b_ps, b_hs, Db, out.data_ptr(), a3.shape[0], H,
        int(scale is not None), 1.0 if scale is None else scale,
    )  # fmt: skip
    return out


def _row_pair(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None):
    """x and u (one shape) as [rows, n] views with unit stride along rows (2-D, or contiguous of any rank), given
    w is None or [rows] (2-D only); else None."""
    if x.shape != u.shape or x.dim() == 0:
        return None
    if x.dim() != 2:
        if w is not None or not (x.is_contiguous() and u.is_contiguous()):
            return None
        x, u = x.view(-1, x.shape[-1]), u.view(-1, u.shape[-1])
    if x.stride(1) != 1 or u.stride(1) != 1:
        return None
    if w is not None and (w.shape != (x.shape[0],) or not w.is_contiguous()):
        return None
    return x, u


def mul_rows(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor | None:
    """`torch_mul_rows` (in place on x) in one pass, for x and u of one shape (2-D with unit stride along rows, or
    contiguous), w [rows] (2-D only); or None."""
    fn = _usable("glm5_mul_rows", x, u, *(() if w is None else (w,)))
    if fn is None or (pair := _row_pair(x, u, w)) is None:
        return None
    x2, u2 = pair
    fn(x2.data_ptr(), x2.stride(0), u2.data_ptr(), u2.stride(0), None if w is None else w.data_ptr(), *x2.shape)
    return x


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor | None:
    """Indices of the k largest values along x's last dim, ascending: the set `x.topk(k).indices` holds. Where
    that set is not unique (values tied with the k-th largest on both sides of the cut) or a row holds NaN, the
    row is torch.topk's own (its order as torch returns it). One pass per row, ~4x faster than torch.topk for
    k ~ n/2 (radix select); or None."""
    fn = _usable("glm5_topk_set", x)
    n = x.shape[-1] if x.dim() else 0
    if fn is None or not 1 <= k <= n or (r := _rows(x)) is None:
        return None
    x2, stride = r
    rows = x2.shape[0]
    out = torch.empty(rows, k + 1, dtype=torch.int64)  # + 1: the kernel's branch-free writes
    scratch = torch.empty(2 * n * torch.get_num_threads(), dtype=torch.int32)  # per thread
    left = fn(x2.data_ptr(), stride, rows, n, k, out.data_ptr(), scratch.data_ptr())
    out = out[:, :k]
    if left:
        redo = (out[:, 0] < 0).nonzero().squeeze(1)
        out[redo] = x2[redo].topk(k, dim=-1, sorted=False).indices
    return out.view(*x.shape[:-1], k)


def softmax_bias(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor | None:
    """`torch_softmax_bias(x, bias)` in place and in one pass per row, for contiguous x [..., t, s] and bias [t, s];
    or None (then x is untouched)."""
    fn = _usable("glm5_softmax_bias", x, bias)
    if fn is None or x.dim() < 2 or bias.shape != x.shape[-2:] or not (x.is_contiguous() and bias.is_contiguous()):
        return None
    t, s = bias.shape
    fn(x.data_ptr(), bias.data_ptr(), x.numel() // max(1, t * s), t, s)
    return x


def silu_mul(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor | None:
    """`torch_silu_mul` (in place on x) in one pass, for x and u of one shape (2-D with unit stride along rows, or
    contiguous), w [rows] (2-D only); or None (then x is untouched).

    Which values take torch's vector exp and which its scalar one depends on how torch walks the tensor: a
    contiguous one as a single run, a strided one row by row, and above 32K values split between threads at
    element boundaries. The kernel follows the first two; with several threads on a larger tensor it stands
    aside."""
    fn = _usable("glm5_silu_mul", x, u, *(() if w is None else (w,)))
    if fn is None or (pair := _row_pair(x, u, w)) is None:
        return None
    if torch.get_num_threads() > 1 and x.numel() > _GRAIN:
        return None
    x2, u2 = pair
    if x2.is_contiguous():  # one run, as torch walks it
        if w is not None or not u2.is_contiguous():
            return None
        fn(x2.data_ptr(), x2.numel(), u2.data_ptr(), u2.numel(), None, 1, x2.numel())
    else:
        fn(x2.data_ptr(), x2.stride(0), u2.data_ptr(), u2.stride(0), None if w is None else w.data_ptr(), *x2.shape)
    return x


def attend_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, out: torch.Tensor
) -> torch.Tensor | None:
    """`torch_attend_heads` head by head in one call (a head's scores stay in cache between its two GEMMs and
    the softmax), the same bits; or None. q, k, v, out: [., H, .] views with unit stride in the last dim, one
    stride between positions and one between heads; bias contiguous [t, s]."""
    fn = _usable("glm5_attend_heads", q, k, v, bias, out)
    if fn is None or q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or out.dim() != 3:
        return None
    (t, H, d), (s, dv) = q.shape, (k.shape[0], v.shape[-1])
    if k.shape != (s, H, d) or v.shape[:2] != (s, H) or out.shape != (t, H, dv) or bias.shape != (t, s):
        return None
    # Rows as BLAS takes them (unit stride, rows at least a row apart), an output whose rows do not overlap,
    # and sizes that fit BLAS's ints.
    if any(x.stride(2) != 1 or x.stride(0) < x.shape[2] or x.stride(1) < 0 for x in (q, k, v, out)):
        return None
    if out.stride(1) < dv or out.stride(0) < H * out.stride(1) or not bias.is_contiguous():
        return None
    if max(q.stride(0), k.stride(0), v.stride(0), out.stride(0), t, s) >= 2**31:
        return None
    scratch = torch.empty(t * s)
    if fn(
        q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(), v.stride(0),
        v.stride(1), bias.data_ptr(), out.data_ptr(), out.stride(0), out.stride(1), H, t, s, d, dv,
        scratch.data_ptr(),
    ):  # fmt: skip
        return None
    return out


_INDEX_BLOCK_ROWS = 256  # (query, head) rows per block of index_scores: 256 x S floats in cache at a time


def index_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """`torch_index_scores` a block of queries at a time (their [rows, S] logits stay in cache), the same bits; or
    None. q [T, I, d] with its (query, head) rows one stride apart, k [S, d] with unit stride in d, w contiguous."""
    fn = _usable("glm5_index_scores", q, k, w)
    if fn is None or q.dim() != 3 or k.dim() != 2 or w.shape != q.shape[:2] or not w.is_contiguous():
        return None
    T, I, d = q.shape
    S = k.shape[0]
    if k.shape[1] != d or k.stride(1) != 1 or k.stride(0) < d or q.stride(2) != 1 or q.stride(1) < d:
        return None
    if q.stride(0) != I * q.stride(1):
        return None
    if max(T * I, S, d, q.stride(1), k.stride(0)) >= 2**31 or not (T and S):
        return None
    if I * S < 400:  # torch's bmm runs its own loop, not BLAS, for products this small
        return None
    out = torch.empty(T, S)
    rows = max(_INDEX_BLOCK_ROWS, I)
    scratch = torch.empty((2 * rows + I) * S)
    if fn(
        q.data_ptr(),
        q.stride(1),
        k.data_ptr(),
        k.stride(0),
        w.data_ptr(),
        out.data_ptr(),
        T,
        I,
        S,
        d,
        rows,
        scratch.data_ptr(),
    ):
        return None
    return out


def _whole_rows(rows: int, n: int) -> bool:
    """Whether torch's element-wise kernels over a [rows, n] tensor, on torch's threads, give every thread whole
    rows: ATen's parallel_for runs a loop over more than 32K values on min(threads, ceil(values / 32K)) threads,
    each taking ceil(values / threads) consecutive values."""
    values, threads = rows * n, torch.get_num_threads()
    if threads <= 1 or values <= _GRAIN:
        return True
    parts = min(threads, -(-values // _GRAIN))
    return (-(-values // parts)) % n == 0


def moe_experts(
    x: torch.Tensor,
    token: torch.Tensor,
    w: torch.Tensor,
    counts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor | None:
    """`torch_moe_experts` in one call: per expert, its rows gathered, the same two sgemm calls torch's grouped GEMM
    makes, the SwiGLU and the weighted scatter-add, with one expert's rows in cache at a time; or None.

    With several threads, only where torch's SiLU would split its work between them at row boundaries: above
    32K activation values torch cuts the [pairs, I] activation into equal runs of values, one per thread, and a
    run that starts inside a row walks that row differently, which decides which values take its vector exp
    (see `silu_mul`). Rows whole, each value goes through the same operations as here. The experts are then
    split between torch's threads, each one's GEMMs on one thread (BLAS gives the same bits on any number of
    threads: the loader checks it), and the scatter-add is split by columns, each value's adds in pair order.
    Torch instead splits each expert's small GEMMs between the threads."""
    fn = _usable("glm5_moe_experts", x, w, gate_up, down, out)
    if fn is None or x.dim() != 2 or out.shape != x.shape or x.stride(1) != 1 or out.stride(1) != 1:
        return None
    E, D, I2 = gate_up.shape
    if down.shape != (E, I2 // 2, D) or x.shape[1] != D or not (gate_up.is_contiguous() and down.is_contiguous()):
        return None
    if not _whole_rows(token.numel(), I2 // 2):
        return None
    if counts.dtype != torch.int64 or token.dtype != torch.int64 or max(D, I2, token.numel()) >= 2**31:
        return None
    if counts.shape != (E,) or w.shape != token.shape or token.dim() != 1:
        return None
    token, counts, w = token.contiguous(), counts.contiguous(), w.contiguous()
    rows = int(counts.max()) if counts.numel() else 0
    # Experts in parallel only where there is work for it (a parallel region costs ~10-50 us to start).
    ways = torch.get_num_threads() if E > 1 and token.numel() * D * I2 >= 1 << 22 else 1
    size = rows * (2 * D + I2) if ways == 1 else ways * rows * (D + I2) + token.numel() * D
    buf = torch.empty(max(1, size))
    if fn(
        x.data_ptr(), x.stride(0), token.data_ptr(), w.data_ptr(), counts.data_ptr(), E, gate_up.data_ptr(),
        down.data_ptr(), D, I2 // 2, out.data_ptr(), out.stride(0), buf.data_ptr(), rows, ways,
    ):  # fmt: skip
        return None  # no BLAS sgemm in this torch: nothing was written
    return out


def status() -> str:
    """One line for logs and benchmarks: which kernels are in use, or why none."""
    if _load() is None:
        return f"cpu kernels: off ({_state.get('note', 'unavailable')})"
    on = sorted(_state["enabled"])
    return f"cpu kernels: {', '.join(k.removeprefix('glm5_') for k in on) or 'none'} ({_state.get('note', '')})"


# ---- building, loading and checking -----------------------------------------------------------------------


def _load() -> dict | None:
    """{kernel name: function} of everything built (the probe's verdicts are in _state["enabled"]), or None."""
    if "fns" in _state:
        return _state["fns"]  # type: ignore[return-value]
    with _lock:
        if "fns" not in _state:
            fns, enabled, note = None, set(), "turned off by GLM5_CPU_KERNELS=0"
            if os.environ.get("GLM5_CPU_KERNELS", "1") != "0":
                fns, enabled, note = _build_and_probe()
            _state.update(enabled=enabled, note=note)
            _state["fns"] = fns
    return _state["fns"]  # type: ignore[return-value]


def _bind(path: Path, names) -> dict:
    lib = ctypes.CDLL(str(path))
    lib.glm5_set_threads.argtypes, lib.glm5_set_threads.restype = (ctypes.c_int,), None
    lib.glm5_set_threads(1)  # the probe runs single-threaded; `_kernel` sets torch's count before any use
    _state.setdefault("set_threads", []).append(lib.glm5_set_threads)
    _state["threads"] = None
    fns = {}
    for name in names:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = _SIGNATURES[name], _RESTYPES.get(name)
        fns[name] = fn
    return fns


def _build_and_probe() -> tuple[dict | None, set[str], str]:
    """Builds and checks the C kernels, then the C++ ones (they are independent: either may be missing)."""
    fns: dict = {}
    enabled: set[str] = set()
    notes = []
    c_names = [n for n, src in _SOURCE_OF.items() if src == "c"]
    note = "no C compiler"
    for lanes in _SUM_LANES:
        try:
            path = _compile("c", f"-DSUM_LANES={lanes}")
        except (OSError, subprocess.SubprocessError) as e:
            note = f"could not compile {_SRC.name}: {_why(e)}"
            break
        if path is None:
            break
        built = _bind(path, c_names)
        ok = _probe(built)
        if ok:
            fns.update(built)
            enabled |= ok
            note = f"{lanes}-float sums"
            break
        note = f"{_SRC.name} differs from torch on this machine"
    notes.append(note)
    cpp_names = [n for n, src in _SOURCE_OF.items() if src == "cpp"]
    try:
        path = _compile("cpp")
        note = "no C++ compiler" if path is None else ""
        if path is not None:
            built = _bind(path, cpp_names)
            ok = _probe(built)
            fns.update(built)
            enabled |= ok
            note = "" if ok else f"{_SRC_VEC.name} differs from torch on this machine"
    except (OSError, subprocess.SubprocessError) as e:
        note = f"could not compile {_SRC_VEC.name}: {_why(e)}"
    if note:
        notes.append(note)
    if not enabled:
        log.info("glm5 CPU kernels not used (%s); running the torch reference", "; ".join(notes))
        return None, set(), "; ".join(notes)
    return fns, enabled, "; ".join(notes)


def _why(e: Exception) -> str:
    err = getattr(e, "stderr", None)
    first = err.decode(errors="replace").strip().splitlines()[:1] if isinstance(err, bytes) else []
    return first[0] if first else str(e)


def _cache_dir() -> Path:
    base = os.environ.get("GLM5_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "glm5", "kernels"
    )
    path = Path(base)
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.gettempdir())


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
    except OSError:
        return platform.machine() + platform.processor()


def _command(kind: str, *defines: str) -> list[str] | None:
    """The compile command for one source, without its output path; None without a compiler."""
    if kind == "c":
        cc = shutil.which(os.environ.get("CC", "cc"))
        return None if cc is None else [cc, *_FLAGS, *defines, str(_SRC), "-lm"]
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        return None
    root = Path(torch.__file__).parent
    capability = torch.backends.cpu.get_cpu_capability()  # the vector code torch's own kernels run here
    cap = [f"-DCPU_CAPABILITY_{capability}", f"-DCPU_CAPABILITY={capability}"] if capability != "DEFAULT" else []
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"
    return [
        cxx, "-std=c++17", *_FLAGS, *cap, abi, "-I", str(root / "include"), str(_SRC_VEC),
        "-L", str(root / "lib"), "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{root / 'lib'}",
    ]  # fmt: skip


def _compile(kind: str, *defines: str) -> Path | None:
    """The shared library for this source, command and CPU: from the cache, or built now (C ~0.5 s, C++ ~3 s)."""
    cmd = _command(kind, *defines)
    if cmd is None:
        return None
    src = (_SRC if kind == "c" else _SRC_VEC).read_bytes()
    key = hashlib.sha256(b"\0".join([src, " ".join(cmd).encode(), torch.__version__.encode(), _cpu_id().encode()]))
    out = _cache_dir() / f"glm5_cpu_kernels_{kind}_{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([*cmd, "-o", tmp], check=True, capture_output=True, timeout=300)
        os.replace(tmp, out)  # atomic: a concurrent build of the same key writes the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _probe(fns: dict) -> set[str]:
    """The kernels (of those in `fns`) whose output equals their reference bit for bit on random inputs of
    several shapes, strides and scales (model/cpu_kernel_probes.py)."""
    from model.cpu_kernel_probes import PROBES

    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        return {name for name, fn in fns.items() if PROBES[name](fn, g)}
