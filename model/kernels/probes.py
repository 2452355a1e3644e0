"""The loader's checks of the fused CPU kernels (model/kernels/build.py): each kernel against its torch reference,
bit for bit, on random inputs of several shapes, strides and scales, before it is ever used. A probe takes the
kernel's ctypes function and a generator and returns whether every case matched.

The references are read from model/kernels/reference.py at call time (`ref.rms_norm`, ...), so a test that
replaces one sees the probe reject its kernel.
"""

from __future__ import annotations

import torch

from model.kernels import reference as ref

_INDEX_BLOCK_ROWS = 256  # any block size the kernel is called with; the prefill's


def _probe_rms_norm(fn, g) -> bool:
    ok = True
    for n in (8, 19, 64, 100, 256, 384, 768, 1000, 2048, 6144, 7168):
        for scale in (1e-3, 1.0, 1e3):
            x = torch.randn(5, n + 3, generator=g)[:, :n] * scale  # rows n + 3 floats apart
            w = torch.randn(n, generator=g)
            out = torch.full((5, n), float("nan"))
            fn(x.data_ptr(), x.stride(0), w.data_ptr(), out.data_ptr(), 5, n, 1e-6)
            ok &= torch.equal(out, ref.rms_norm(x, w, 1e-6))
    return ok


def _probe_add_rms_norm(fn, g) -> bool:
    ok = True
    for n in (8, 19, 100, 256, 768, 2048, 7168):
        for scale in (1e-3, 1.0, 1e3):
            a, h = torch.randn(5, n, generator=g) * scale, torch.randn(5, n, generator=g) * scale
            w = torch.randn(n, generator=g)
            s, y = a.clone(), torch.full((5, n), float("nan"))
            fn(a.data_ptr(), h.data_ptr(), s.data_ptr(), w.data_ptr(), y.data_ptr(), 5, n, 1e-6)
            ref_s, ref_y = ref.add_rms_norm(a, h, w, 1e-6)
            ok &= torch.equal(s, ref_s) and torch.equal(y, ref_y)
    return ok


def _probe_rope(fn, g) -> bool:
    ok = True
    for P, H, R, tail in ((7, 1, 8, 0), (5, 3, 32, 0), (6, 4, 16, 48), (3, 2, 64, 0)):
        x = torch.randn(P, H, R + tail + 5, generator=g)[..., : R + tail]  # heads R + tail + 5 floats apart
        ang = torch.randn(P, 1, R // 2, generator=g) * 10
        cos, sin = ang.cos(), ang.sin()
        out = torch.full((P, H, R + tail), float("nan"))
        D = R + tail
        fn(
            x.data_ptr(),
            x.stride(0),
            x.stride(1),
            cos.data_ptr(),
            sin.data_ptr(),
            out.data_ptr(),
            H * D,
            D,
            P,
            H,
            R,
            tail,
        )
        ok &= torch.equal(out, torch.cat([ref.rope(x[..., :R], cos, sin), x[..., R:]], -1))
    return ok


def _probe_attn_bias(fn, g) -> bool:
    ok = True
    for t, S, K in ((5, 9, 4), (16, 40, 8), (7, 7, 7)):
        q_idx = torch.arange(S - t, S)
        topk = torch.stack([torch.randperm(S, generator=g)[:K] for _ in range(t)])
        for picks in (None, topk):
            out = torch.full((t, S), float("nan"))
            fn(None if picks is None else picks.data_ptr(), K, q_idx.data_ptr(), t, S, out.data_ptr())
            ok &= torch.equal(out, ref.attn_bias(picks, q_idx, S))
    return ok


def _probe_concat_heads(fn, g) -> bool:
    ok = True
    for P, H, Da, Db, bh in ((4, 3, 8, 5, 3), (6, 8, 16, 8, 1), (2, 1, 3, 7, 1)):
        a = torch.randn(P, H, Da + 4, generator=g)[..., :Da]
        b = torch.randn(P, bh, Db + 2, generator=g)[..., 2:]
        for scale in (None, 0.1):
            out = torch.full((P, H, Da + Db), float("nan"))
            fn(
                a.data_ptr(), a.stride(0), a.stride(1), Da, b.data_ptr(), b.stride(0), 0 if bh == 1 else b.stride(1),
                Db, out.data_ptr(), P, H, int(scale is not None), scale or 1.0,
            )  # fmt: skip
            ok &= torch.equal(out, ref.concat_heads(a, b, scale))
    return ok


def _probe_rows_product(reference):
    """A probe for the in-place row products (x *= u (, w) or x = silu(x) * u (, w)), on rows of a wider tensor
    (walked row by row) and on a contiguous one (walked as one run); odd lengths too."""

    def probe(fn, g) -> bool:
        ok = True
        for rows, n in ((3, 17), (9, 256), (4, 100), (2, 2048)):
            h, u = torch.randn(rows, 2 * n, generator=g) * 4, torch.randn(rows, n, generator=g)
            w = torch.rand(rows, generator=g)
            for ws in (None, w):
                got = h.clone()
                fn(got.data_ptr(), 2 * n, u.data_ptr(), n, None if ws is None else ws.data_ptr(), rows, n)
                ok &= torch.equal(got[:, :n], reference(h.clone()[:, :n], u, ws))
            x = h[:, :n].contiguous()
            got = x.clone()
            fn(got.data_ptr(), rows * n, u.data_ptr(), rows * n, None, 1, rows * n)
            ok &= torch.equal(got, reference(x.clone(), u, None))
        return ok

    return probe


def _probe_topk_set(fn, g) -> bool:
    ok = True
    for rows, n, k in ((40, 64, 20), (9, 512, 256), (4, 7, 7), (5, 100, 1)):
        x = torch.randn(rows, n, generator=g)
        x[0, : n // 2] = 0.0  # a tie across the cut (left to torch)
        x[1, 3] = float("nan")
        x[2, 1::2] = -x[2, 1::2].abs() * 0.0  # -0.0 and +0.0 mixed: equal, as torch compares them
        x[3, n // 3 :] = float("-inf")
        out, scratch = torch.empty(rows, k + 1, dtype=torch.int64), torch.empty(2 * n, dtype=torch.int32)
        left = fn(x.data_ptr(), n, rows, n, k, out.data_ptr(), scratch.data_ptr())
        ref = x.topk(k, dim=-1, sorted=False).indices.sort(-1).values
        unique = out[:, 0] >= 0
        ok &= bool(torch.equal(out[unique, :k], ref[unique])) and left == int((~unique).sum()) and bool(out[1, 0] < 0)
    return ok


def _probe_softmax_bias(fn, g) -> bool:
    ok = True
    for B, t, s in ((3, 5, 7), (8, 16, 128), (2, 9, 100), (1, 4, 512)):
        x = torch.randn(B, t, s, generator=g) * 5
        bias = torch.zeros(t, s).masked_fill_(torch.rand(t, s, generator=g) < 0.3, float("-inf"))
        bias[:, 0] = 0.0  # every row keeps a key
        got = x.clone()
        fn(got.data_ptr(), bias.data_ptr(), B, t, s)
        ok &= torch.equal(got, ref.softmax_bias(x.clone(), bias))
    return ok


def _probe_attend_heads(fn, g) -> bool:
    """Query blocks of the prefill's shapes (q and k [., H, d] with position strides of H * d, v a half of a wider
    [k | v] row, the output rows of a bigger tensor) and odd ones, against the torch path."""
    ok = True
    for t, s, H, d, dv in ((128, 384, 8, 96, 64), (5, 37, 3, 10, 6), (64, 64, 2, 48, 32)):
        q = torch.randn(t, H, d, generator=g)
        k = torch.randn(s, H, d, generator=g)
        kv = torch.randn(s, H, d + dv, generator=g)
        v = kv[..., d:]
        bias = torch.zeros(t, s).masked_fill_(torch.rand(t, s, generator=g) < 0.4, float("-inf"))
        bias[:, 0] = 0.0
        want = ref.attend_heads(q, k, v, bias, torch.empty(t + 2, H, dv)[1:-1])
        got = torch.full((t + 2, H, dv), float("nan"))[1:-1]
        scratch = torch.empty(t * s)
        r = fn(
            q.data_ptr(), H * d, d, k.data_ptr(), H * d, d, v.data_ptr(), H * (d + dv), d + dv, bias.data_ptr(),
            got.data_ptr(), H * dv, dv, H, t, s, d, dv, scratch.data_ptr(),
        )  # fmt: skip
        ok &= r == 0 and torch.equal(got, want)
    return ok


def _probe_index_scores(fn, g) -> bool:
    """Blocks of (query, head) rows against the one product over all of them: at the prefill's shapes (256
    queries x 8 heads, and a short tail) and small ones, including fewer rows than a block (products of
    I x S >= 400 values: below that torch's bmm does not call BLAS, and the kernel declines)."""
    ok = True
    for T, I, d, S in ((256, 8, 64, 512), (300, 8, 64, 700), (37, 16, 10, 40), (40, 8, 16, 64)):
        q, k = torch.randn(T, I, d, generator=g), torch.randn(S, d, generator=g)
        w = torch.randn(T, I, generator=g)
        out = torch.empty(T, S)
        scratch = torch.empty((2 * _INDEX_BLOCK_ROWS + I) * S)
        r = fn(q.data_ptr(), d, k.data_ptr(), d, w.data_ptr(), out.data_ptr(), T, I, S, d, _INDEX_BLOCK_ROWS,
               scratch.data_ptr())  # fmt: skip
        ok &= r == 0 and torch.equal(out, ref.index_scores(q[None], k[None], w[None])[0])
    return ok


def _probe_moe_experts(fn, g) -> bool:
    """Random routings of tokens to experts (an expert with no tokens, one with one), at toy sizes and at the
    `small` preset's (768 / 256), against the torch path."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel's condition (`moe_experts`); the reference's SiLU walk depends on it
    try:
        return _probe_moe_cases(fn, g)
    finally:
        torch.set_num_threads(threads)


def _probe_moe_cases(fn, g) -> bool:
    ok = True
    for N, E, k, D, I in ((9, 4, 2, 40, 12), (64, 8, 2, 96, 48), (256, 32, 4, 768, 256)):
        x, out = torch.randn(N, D, generator=g), torch.randn(N, D, generator=g)
        gate_up, down = torch.randn(E, D, 2 * I, generator=g) / D**0.5, torch.randn(E, I, D, generator=g) / I**0.5
        idx = torch.stack([torch.randperm(E - 1, generator=g)[:k] for _ in range(N)])  # expert E-1: no tokens
        idx[0, 0] = 0 if idx[0, 1] != 0 else 1
        flat = idx.flatten()
        order = flat.argsort(stable=True)
        token, counts = order // k, torch.bincount(flat, minlength=E)
        w = torch.rand(N * k, generator=g)
        want = ref.moe_experts(x, token, w, counts, gate_up, down, out.clone())
        rows = int(counts.max())
        for ways in (1, 2):  # one expert after another; experts split between two threads
            got = out.clone()
            buf = torch.empty(ways * rows * (2 * D + 2 * I) + N * k * D)
            r = fn(
                x.data_ptr(), D, token.data_ptr(), w.data_ptr(), counts.data_ptr(), E, gate_up.data_ptr(),
                down.data_ptr(), D, I, got.data_ptr(), D, buf.data_ptr(), rows, ways,
            )  # fmt: skip
            ok &= r == 0 and torch.equal(got, want)
    # BLAS's bits on any number of threads (the expert-parallel path runs each GEMM on one, torch on all of them)
    a, b = torch.randn(64, 768, generator=g), torch.randn(768, 512, generator=g)
    one = a @ b
    torch.set_num_threads(2)
    ok &= torch.equal(a @ b, one)
    return ok


PROBES = {
    "glm5_rms_norm": _probe_rms_norm,
    "glm5_add_rms_norm": _probe_add_rms_norm,
    "glm5_rope": _probe_rope,
    "glm5_attn_bias": _probe_attn_bias,
    "glm5_concat_heads": _probe_concat_heads,
    "glm5_mul_rows": _probe_rows_product(lambda x, u, w: ref.mul_rows(x, u, w)),
    "glm5_topk_set": _probe_topk_set,
    "glm5_softmax_bias": _probe_softmax_bias,
    "glm5_silu_mul": _probe_rows_product(lambda x, u, w: ref.silu_mul(x, u, w)),
    "glm5_moe_experts": _probe_moe_experts,
    "glm5_attend_heads": _probe_attend_heads,
    "glm5_index_scores": _probe_index_scores,
}
