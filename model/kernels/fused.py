"""The fused CPU kernels' Python side: each function checks that its kernel applies (CPU fp32, no autograd, a
layout it takes, the kernel built and passed its probe) and runs it, or returns None and touches nothing. The
caller (model/kernels/ops.py) then runs the reference (model/kernels/reference.py), which gives the same bits.

A call costs ~2 us before any work, which is still less than the torch calls it replaces even for one row (7 vs
9 us for a 1 x 768 RMSNorm). Rows are split between as many threads as torch uses, in torch's own OpenMP
runtime, when a call has at least 32K values; the SiLU kernel stays on one thread (see `silu_mul`).
"""

from __future__ import annotations

import torch

from model.kernels import build


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """x as [rows, n] with unit stride along n and one stride between rows, or None."""
    try:
        x2 = x.view(-1, x.shape[-1])
    except RuntimeError:
        return None
    if x2.stride(1) != 1 and x2.shape[1] > 1:
        return None
    return x2, x2.stride(0)


def _usable(name: str, *tensors: torch.Tensor):
    """The kernel's function if it may run on these tensors (CPU fp32, no autograd), else None."""
    if torch.is_grad_enabled():
        return None
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    return build.kernel(name)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """`reference.rms_norm(x, weight, eps)` in two passes per row, or None (see the module docstring)."""
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
    """`reference.add_rms_norm`: a += h (in place), and the RMSNorm of the sum, in one pass per row; or None."""
    fn = _usable("glm5_add_rms_norm", a, h, weight)
    if fn is None or a.shape != h.shape or not (a.is_contiguous() and h.is_contiguous() and weight.is_contiguous()):
        return None
    n = a.shape[-1]
    out = torch.empty(a.shape, dtype=a.dtype)
    fn(a.data_ptr(), h.data_ptr(), a.data_ptr(), weight.data_ptr(), out.data_ptr(), a.numel() // n, n, eps)
    return a, out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int | None = None) -> torch.Tensor | None:
    """`reference.rope` on the first `rotary` values of x's last dim (all of them by default), the rest copied
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
    """`reference.attn_bias` in one pass, contiguous fp32 [t, s_end]; or None."""
    if torch.is_grad_enabled() or q_idx_t.device.type != "cpu" or q_idx_t.dim() != 1:
        return None
    fn = build.kernel("glm5_attn_bias")
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
    """`reference.concat_heads` in one pass, for a [..., H, Da] and b [..., H or 1, Db]; or None."""
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
    """`reference.mul_rows` (in place on x) in one pass, for x and u of one shape (2-D with unit stride along rows, or
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
    """`reference.softmax_bias(x, bias)` in place and in one pass per row, for contiguous x [..., t, s] and bias [t, s];
    or None (then x is untouched)."""
    fn = _usable("glm5_softmax_bias", x, bias)
    if fn is None or x.dim() < 2 or bias.shape != x.shape[-2:] or not (x.is_contiguous() and bias.is_contiguous()):
        return None
    t, s = bias.shape
    fn(x.data_ptr(), bias.data_ptr(), x.numel() // max(1, t * s), t, s)
    return x


def silu_mul(x: torch.Tensor, u: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor | None:
    """`reference.silu_mul` (in place on x) in one pass, for x and u of one shape (2-D with unit stride along rows, or
    contiguous), w [rows] (2-D only); or None (then x is untouched).

    Which values take torch's vector exp and which its scalar one depends on how torch walks the tensor: a
    contiguous one as a single run, a strided one row by row, and above 32K values split between threads at
    element boundaries. The kernel follows the first two; with several threads on a larger tensor it stands
    aside."""
    fn = _usable("glm5_silu_mul", x, u, *(() if w is None else (w,)))
    if fn is None or (pair := _row_pair(x, u, w)) is None:
        return None
    if torch.get_num_threads() > 1 and x.numel() > build.GRAIN:
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
    """`reference.attend_heads` head by head in one call (a head's scores stay in cache between its two GEMMs and
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
    """`reference.index_scores` a block of queries at a time (their [rows, S] logits stay in cache), the same bits; or
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
    if threads <= 1 or values <= build.GRAIN:
        return True
    parts = min(threads, -(-values // build.GRAIN))
    return (-(-values // parts)) % n == 0


def moe_experts(
    x: torch.Tensor, token: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor,
    down: torch.Tensor, out: torch.Tensor,
) -> torch.Tensor | None:  # fmt: skip
    """`reference.moe_experts` in one call: per expert, its rows gathered, the same two sgemm calls torch's grouped GEMM
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
