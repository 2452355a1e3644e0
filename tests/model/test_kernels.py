"""The fused CPU kernels (model/kernels): each gives its torch reference's bits, the loader uses only kernels that
pass the probe (and logs the others), and a model forward is the same with impl "fused" and "torch".

Which kernels pass their probe depends on the machine (a CPU's vector width, the BLAS build, the thread count):
a kernel's own tests run where it passed, and are skipped, not failed, elsewhere; the exact element-wise
kernels (masks, copies, RoPE, top-k) must pass on any IEEE machine with a compiler."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch

from model import GLM5ForCausalLM, kernels
from model.kernels import build, fused, reference
from tests.model.conftest import randomize, tiny

ALL = {
    "glm5_rms_norm",
    "glm5_add_rms_norm",
    "glm5_rope",
    "glm5_attn_bias",
    "glm5_concat_heads",
    "glm5_mul_rows",
    "glm5_topk_set",
    "glm5_softmax_bias",
    "glm5_silu_mul",
    "glm5_moe_experts",
    "glm5_attend_heads",
    "glm5_index_scores",
}
# Kernels whose arithmetic is exact (comparisons, copies, one multiply-add order fixed by -ffp-contract=off):
# they equal torch wherever they build.
EXACT = {"glm5_attn_bias", "glm5_concat_heads", "glm5_rope", "glm5_topk_set", "glm5_mul_rows"}
HAS_CC = shutil.which(os.environ.get("CC", "cc")) is not None and shutil.which(os.environ.get("CXX", "c++")) is not None
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C / C++ compiler")


def _enabled() -> set[str]:
    """The kernels that passed their probe in this process (none with GLM5_CPU_KERNELS=0 or no compiler)."""
    return set(build._state["enabled"]) if HAS_CC and build.load() is not None else set()


def needs(*names: str):
    """Run only where these kernels passed their probe here: elsewhere they are not used, and there is nothing
    of theirs to test."""
    missing = sorted(set(names) - _enabled())
    return pytest.mark.skipif(bool(missing), reason=f"kernel(s) not used on this machine: {missing}")


@pytest.fixture
def fresh_state(monkeypatch, tmp_path):
    """An empty loader state and cache directory for this test; the process's own state afterwards."""
    saved = dict(build._state)
    build._state.clear()
    monkeypatch.delenv("GLM5_CPU_KERNELS", raising=False)
    monkeypatch.setenv("GLM5_KERNEL_CACHE", str(tmp_path / "kernels"))
    yield tmp_path / "kernels"
    build._state.clear()
    build._state.update(saved)


@needs_cc
def test_kernels_are_built_and_the_exact_ones_pass_their_probe(fresh_state, caplog):
    """The others pass where torch sums as they do (8- or 16-float vectors, BLAS giving a row the same bits in any
    batch): a failed probe is logged and that op runs its reference, never an error."""
    with caplog.at_level("INFO", logger="model.kernels.build"):
        assert build.load() is not None
    enabled = build._state["enabled"]
    assert EXACT <= enabled <= ALL, build.status()
    assert "rms_norm" in build.status() or "differ" in build.status()
    rejected = sorted(n.removeprefix("glm5_") for n in ALL - enabled)
    if rejected:
        assert ", ".join(rejected) in caplog.text and ", ".join(rejected) in build.status()


@needs("glm5_rms_norm", "glm5_add_rms_norm")
@pytest.mark.parametrize(
    "shape, pad", [((1, 64), 0), ((3, 100), 5), ((512, 768), 0), ((2, 7, 384), 0), ((40, 256), 32)]
)
def test_rms_norm_kernels_give_the_references_bits(shape, pad):
    g = torch.Generator().manual_seed(1)
    n = shape[-1]
    x = (torch.randn(*shape[:-1], n + pad, generator=g) * 3)[..., pad:]  # rows n + pad apart when pad
    w = torch.randn(n, generator=g)
    with torch.inference_mode():
        got = fused.rms_norm(x, w, 1e-6)
        assert got is not None and torch.equal(got, reference.rms_norm(x, w, 1e-6))
        a, h = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        want_sum, want = reference.add_rms_norm(a.clone(), h, w, 1e-6)
        both = fused.add_rms_norm(a, h, w, 1e-6)
        assert both is not None
        assert both[0] is a and torch.equal(a, want_sum) and torch.equal(both[1], want)


@needs("glm5_rms_norm", "glm5_add_rms_norm")
def test_kernels_step_aside_for_autograd_other_dtypes_and_layouts():
    x, w = torch.randn(8, 64), torch.randn(64)
    assert fused.rms_norm(x, w, 1e-6) is None  # autograd on: the reference, which autograd can follow
    with torch.inference_mode():
        assert fused.rms_norm(x.bfloat16(), w.bfloat16(), 1e-6) is None
        assert fused.rms_norm(x.t(), torch.randn(8), 1e-6) is None  # values along a strided dim
        assert fused.add_rms_norm(x, x.t().contiguous().t(), w, 1e-6) is None  # not contiguous
        assert fused.rms_norm(x, w, 1e-6) is not None


@needs("glm5_rope")
def test_rope_kernel_gives_the_references_bits():
    from model.rope import rope_cos_sin

    g = torch.Generator().manual_seed(2)
    B, T, H, R = 2, 9, 4, 16
    cos, sin = rope_cos_sin(torch.arange(T).expand(B, T) + 3, R, 10000.0)
    q = torch.randn(B, T, H, 24 + R, generator=g)[..., 24:]  # a split view, as MLA's q_pe
    k = torch.randn(B, T, 40, generator=g)[..., 8 : 8 + R]  # as k_pe, a slice of kv_a's output
    idx = torch.randn(B, T, H, 32, generator=g)  # the indexer's [rope | nope] layout
    with torch.inference_mode():
        got = fused.rope(q, cos[:, :, None], sin[:, :, None])
        assert got is not None and torch.equal(got, reference.rope(q, cos[:, :, None], sin[:, :, None]))
        got = fused.rope(k, cos, sin)
        assert got is not None and torch.equal(got, reference.rope(k, cos, sin))
        got = fused.rope(idx, cos[:, :, None], sin[:, :, None], rotary=R)
        want = torch.cat([reference.rope(idx[..., :R], cos[:, :, None], sin[:, :, None]), idx[..., R:]], -1)
        assert got is not None and torch.equal(got, want)
        assert fused.rope(q, cos[:, :1, None], sin[:, :1, None]) is None  # cos/sin that broadcast otherwise


@needs("glm5_attn_bias", "glm5_concat_heads")
def test_attention_kernels_give_the_references_bits():
    g = torch.Generator().manual_seed(3)
    t, S, K = 6, 20, 8
    q_idx = torch.arange(S - t, S) - 2  # the block's keys end 2 past its last query
    topk = torch.stack([torch.randperm(S - 2, generator=g)[:K] for _ in range(t)])
    with torch.inference_mode():
        for picks in (None, topk):
            got = fused.attn_bias(picks, q_idx, S - 2)
            assert got is not None and torch.equal(got, reference.attn_bias(picks, q_idx, S - 2))
        a = torch.randn(2, 5, 3, 24, generator=g)[..., :16]  # q_nope: a split view
        b = torch.randn(2, 5, 3, 8, generator=g)
        b1 = torch.randn(2, 5, 12, generator=g)[..., 4:][:, :, None]  # k_pe [B, S, 1, R]: one vector for all heads
        for other, scale in ((b, 0.125), (b1, None), (b1, 0.3)):
            got = fused.concat_heads(a, other, scale)
            assert got is not None and torch.equal(got, reference.concat_heads(a, other, scale))


@needs("glm5_mul_rows")
def test_mul_rows_gives_the_references_bits():
    g = torch.Generator().manual_seed(4)
    h = torch.randn(30, 64, generator=g)
    act, u = h[:, :32], h[:, 32:]  # the two halves of a gate|up output, as the MoE has them
    w = torch.rand(30, generator=g)
    with torch.inference_mode():
        want = reference.mul_rows(act.clone(), u, w)
        got = fused.mul_rows(act, u, w)
        assert got is act and torch.equal(act, want)
        x3, u3 = torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)
        want = reference.mul_rows(x3.clone(), u3)
        assert fused.mul_rows(x3, u3) is x3 and torch.equal(x3, want)


@needs("glm5_softmax_bias", "glm5_silu_mul")
def test_softmax_and_silu_kernels_give_the_references_bits(monkeypatch):
    g = torch.Generator().manual_seed(7)
    with torch.inference_mode():
        for H, t, s in ((8, 128, 384), (3, 5, 37)):
            x = torch.randn(H, t, s, generator=g) * 4
            bias = torch.zeros(t, s).masked_fill_(torch.rand(t, s, generator=g) < 0.5, float("-inf"))
            bias[:, 0] = 0.0
            want = reference.softmax_bias(x.clone(), bias)
            got = fused.softmax_bias(x, bias)
            assert got is x and torch.equal(x, want)
        for rows, n in ((64, 256), (5, 37)):
            h, w = torch.randn(rows, 2 * n, generator=g) * 3, torch.rand(rows, generator=g)
            for weights in (None, w):  # a half of a gate|up output: walked row by row, as torch does
                want = reference.silu_mul(h.clone()[:, :n], h[:, n:], weights)
                got = h.clone()
                assert fused.silu_mul(got[:, :n], got[:, n:], weights) is not None
                assert torch.equal(got[:, :n], want)
            x, u = h[:, :n].contiguous(), h[:, n:].contiguous()  # contiguous: one run, as torch walks it
            want = reference.silu_mul(x.clone(), u)
            assert fused.silu_mul(x, u) is x and torch.equal(x, want)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # torch would split this SiLU between threads
        big = torch.randn(300, 256)
        assert fused.silu_mul(big, big.clone()) is None and fused.silu_mul(big[:4], big[:4]) is not None


@needs("glm5_attend_heads")
@pytest.mark.parametrize("t, s, H, d, dv", [(128, 512, 8, 96, 64), (7, 30, 3, 20, 12)])
def test_attend_heads_kernel_gives_the_references_bits(t, s, H, d, dv):
    """A query block's attention head by head against the torch path (two bmm and the masked softmax), on the
    layouts attend_expanded passes: q and k assembled [., H, d], v the second half of kv_b's [k | v] rows, the
    output rows of the whole sequence's [T, H, dv]; a causal + top-k mask. And its conditions."""
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(t, H, d, generator=g), torch.randn(s, H, d, generator=g)
    v = torch.randn(s, H, 2 * dv, generator=g)[..., dv:]
    bias = torch.zeros(t, s).masked_fill_(torch.rand(t, s, generator=g) < 0.5, float("-inf"))
    bias[:, 0] = 0.0
    with torch.inference_mode():
        want = reference.attend_heads(q, k, v, bias, torch.empty(t + 5, H, dv)[3 : 3 + t])
        out = torch.full((t + 5, H, dv), float("nan"))
        assert fused.attend_heads(q, k, v, bias, out[3 : 3 + t]) is not None
        assert torch.equal(out[3 : 3 + t], want) and out[:3].isnan().all() and out[3 + t :].isnan().all()
        assert fused.attend_heads(q.transpose(0, 1), k, v, bias, out[:t]) is None  # not [t, H, d]
        assert fused.attend_heads(q, k, v, bias.t().contiguous().t(), out[:t]) is None  # bias not contiguous
    assert fused.attend_heads(q, k, v, bias, out[:t]) is None  # autograd on


@needs("glm5_index_scores")
@pytest.mark.parametrize("T, I, d, S", [(256, 8, 64, 512), (600, 8, 64, 1000), (30, 8, 16, 64)])
def test_index_scores_kernel_gives_the_references_bits(T, I, d, S):  # noqa: E741
    """The indexer's scores a block of queries at a time against one product over every (query, head) row: the
    `small` preset's prefill, a longer one with a tail block, a short one; queries as the indexer makes them
    ([T, I, d] rows of a contiguous tensor), keys a strided view. And its conditions."""
    g = torch.Generator().manual_seed(10)
    q = torch.randn(T, I, d, generator=g)
    k = torch.randn(S, d + 4, generator=g)[:, 2 : 2 + d]
    w = torch.randn(T, I, generator=g).abs()
    with torch.inference_mode():
        got = fused.index_scores(q, k, w)
        assert got is not None and torch.equal(got, reference.index_scores(q[None], k[None], w[None])[0])
        assert fused.index_scores(q[:, :, :4].contiguous(), k[:4, :4].contiguous(), w) is None  # I x S < 400
        assert fused.index_scores(q.transpose(0, 1), k, w.t()) is None  # (query, head) rows not in order
    assert fused.index_scores(q, k, w) is None  # autograd on


@needs("glm5_moe_experts")
@pytest.mark.parametrize("N, E, k, D, I", [(512, 32, 4, 768, 256), (37, 6, 2, 40, 20)])
def test_moe_experts_kernel_gives_the_references_bits(monkeypatch, N, E, k, D, I):  # noqa: E741
    """The fused routed experts against the torch path (gather, grouped GEMM, SwiGLU, grouped GEMM, scatter-add) on
    a real routing (the `small` preset's sizes, skewed counts, an idle expert), into an output with rows further
    apart than D; and its conditions: autograd, a thread split of torch's SiLU, a strided stack."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(N, D + 8, generator=g)[:, :D]
    out = torch.randn(N, D + 16, generator=g)[:, 8 : 8 + D]
    gate_up, down = torch.randn(E, D, 2 * I, generator=g) / D**0.5, torch.randn(E, I, D, generator=g) / I**0.5
    logits = torch.randn(N, E, generator=g) + torch.linspace(2, 0, E)  # earlier experts get more tokens
    logits[:, -1] = float("-inf")  # the last expert gets none
    idx = logits.topk(k, dim=-1).indices
    flat = idx.flatten()
    order = flat.argsort(stable=True)
    token, counts = order // k, torch.bincount(flat, minlength=E)
    w = torch.rand(N * k, generator=g)
    with torch.inference_mode():
        want = reference.moe_experts(x, token, w, counts, gate_up, down, out.clone())
        got = out.clone()
        assert fused.moe_experts(x, token, w, counts, gate_up, down, got) is got
        assert torch.equal(got, want)
        assert fused.moe_experts(x, token, w, counts, gate_up.transpose(1, 2), down, got) is None
        # Three threads: torch's SiLU would split a big layer's activation inside rows (two: between rows).
        monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
        assert (fused.moe_experts(x, token, w, counts, gate_up, down, got) is None) == (N * k * I > 32768)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
        assert fused.moe_experts(x, token, w, counts, gate_up, down, got) is not None
    assert fused.moe_experts(x, token, w, counts, gate_up, down, got) is None  # autograd on


@needs("glm5_topk_set")
@pytest.mark.parametrize("rows, n, k", [(50, 512, 256), (30, 64, 20), (8, 7, 7), (8, 100, 1)])
def test_topk_kernel_gives_torchs_set_and_leaves_ambiguous_rows_to_torch(rows, n, k):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, n, generator=g)
    x[0, : n // 2 + 1] = 0.0  # ties across the cut: torch's pick among them is torch's business
    x[1, n // 3] = float("nan")
    x[2, ::2] = 0.0
    x[2, 1::2] = -0.0  # +0 and -0 compare equal: a tie too
    x[3, n // 4 :] = float("-inf")  # masked keys, as the causal mask leaves them
    x[4] = torch.arange(n, dtype=torch.float32)  # distinct: one answer
    with torch.inference_mode():
        got = fused.topk_indices(x, k)
        want = x.topk(k, dim=-1, sorted=False).indices
    assert got is not None and got.shape == (rows, k)
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)
    kth = (
        x.nan_to_num(nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))
        .sort(-1, descending=True)
        .values[:, k - 1 : k]
    )
    ambiguous = [r for r in range(rows) if x[r].isnan().any() or int((x[r] >= kth[r]).sum()) != k]
    assert 1 in ambiguous and 4 not in ambiguous and (k != n // 2 or {0, 2} <= set(ambiguous))
    for r in ambiguous:  # torch.topk's own answer, as torch returns it
        assert torch.equal(got[r], want[r])
    unique = [r for r in range(rows) if r not in ambiguous]
    assert torch.equal(got[unique], got[unique].sort(-1).values)  # the kernel's rows: ascending


@needs_cc
@pytest.mark.parametrize("batch", [1, 2])
def test_model_forward_is_the_same_with_and_without_kernels(monkeypatch, batch):
    """The tiny model over 64 tokens (past index_topk = 16: the sparse path; 8 index heads x 64 keys: enough for
    index_scores) gives the same logits, bit for bit, with the kernels and with every kernel turned off (the
    torch references)."""
    model = randomize(GLM5ForCausalLM.from_config(tiny(), seed=0)).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, 64), generator=torch.Generator().manual_seed(6))
    calls = []
    real = build.kernel
    monkeypatch.setattr(build, "kernel", lambda name: calls.append(name) or real(name))
    with torch.inference_mode():
        fast = model(ids)
        used = {n for n in calls if real(n) is not None}
        calls.clear()
        with kernels.use("torch"):
            plain = model(ids)
    assert not calls  # impl "torch": not one kernel asked for
    # SwiGLU's product: silu_mul does it with the SiLU (mul_rows is its fallback); the masked softmax: attend_heads
    # does it between its GEMMs (softmax_bias is its fallback).
    fused_away = {"glm5_mul_rows", "glm5_softmax_bias"}
    # One sequence at a time (batches of one: the engine's): its mask, its attention, its index scores.
    per_sequence = {"glm5_attn_bias", "glm5_attend_heads", "glm5_index_scores"}
    expected = _enabled() - fused_away - (per_sequence if batch > 1 else set())
    if "glm5_attend_heads" not in _enabled() or batch > 1:
        expected |= {"glm5_softmax_bias"} & _enabled()  # the masked softmax between torch's GEMMs instead
    if "glm5_silu_mul" not in _enabled():
        expected |= {"glm5_mul_rows"} & _enabled()
    assert used == expected
    assert torch.equal(fast, plain)


@needs("glm5_rms_norm", "glm5_rope", "glm5_topk_set")
def test_probe_rejects_a_kernel_that_differs_from_its_reference(monkeypatch):
    lib = build.load()
    monkeypatch.setattr(reference, "rms_norm", lambda x, w, eps: x * w)  # a different function
    enabled = build._probe(lib)
    assert "glm5_rms_norm" not in enabled and "glm5_add_rms_norm" not in enabled
    assert {"glm5_rope", "glm5_topk_set"} <= enabled


@needs(*EXACT)
def test_a_probe_that_raises_rejects_its_kernel_and_nothing_else(monkeypatch, caplog):
    lib = build.load()

    def broken(fn, g):
        raise RuntimeError("no such instruction")

    monkeypatch.setitem(build.PROBES, "glm5_rope", broken)
    with caplog.at_level("INFO", logger="model.kernels.build"):
        enabled = build._probe(lib)
    assert "glm5_rope" not in enabled and EXACT - {"glm5_rope"} <= enabled
    assert "glm5_rope: its probe raised no such instruction" in caplog.text


def test_turned_off_by_the_environment(fresh_state, monkeypatch):
    monkeypatch.setenv("GLM5_CPU_KERNELS", "0")
    with torch.inference_mode():
        assert fused.rms_norm(torch.randn(4, 64), torch.randn(64), 1e-6) is None
    assert build.status() == "cpu kernels: off (turned off by GLM5_CPU_KERNELS=0)"


def test_without_a_working_compiler_the_references_run(fresh_state, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    assert build.load() is None and "no C compiler" in build.status()
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'cc: internal error' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(broken))
    monkeypatch.setenv("CXX", str(broken))
    build._state.clear()
    assert build.load() is None
    assert "could not compile cpu_kernels.c: cc: internal error" in build.status()
    model = randomize(GLM5ForCausalLM.from_config(tiny(), seed=0)).eval()
    with torch.inference_mode():
        assert torch.isfinite(model(torch.randint(0, 100, (1, 20)))).all()
    assert not list(fresh_state.glob("*.so"))


@needs_cc
def test_the_c_kernels_work_without_a_cpp_compiler(fresh_state, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    assert build.load() is not None
    assert EXACT <= build._state["enabled"] <= ALL - set(build._CPP)
    assert "no C++ compiler" in build.status()


@needs_cc
def test_the_build_is_cached(fresh_state):
    assert build.load() is not None
    enabled = set(build._state["enabled"])
    built = {p.name: p.stat().st_mtime_ns for p in fresh_state.glob("*.so")}
    assert len(built) == 2  # the C and the C++ library
    build._state.clear()
    assert build.load() is not None and build._state["enabled"] == enabled
    assert {p.name: p.stat().st_mtime_ns for p in fresh_state.glob("*.so")} == built


@needs("glm5_rms_norm", "glm5_topk_set", "glm5_softmax_bias", "glm5_rope", "glm5_moe_experts")
def test_kernels_split_between_threads_give_the_same_bits(monkeypatch):
    """Above 32K values the kernels split rows between torch's threads (not under OMP_WAIT_POLICY=PASSIVE,
    where they stay on one): every row is still computed whole, so the bits are the references'."""
    monkeypatch.setattr(build, "PASSIVE", False)
    g = torch.Generator().manual_seed(8)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            x, w = torch.randn(512, 768, generator=g), torch.randn(768, generator=g)
            assert torch.equal(fused.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
            assert build._state["threads"] == 2
            s = torch.randn(300, 512, generator=g)
            s[7, :300] = 0.0  # a tie row among them, left to torch
            got = fused.topk_indices(s, 256)
            assert torch.equal(got.sort(-1).values, s.topk(256, -1, sorted=False).indices.sort(-1).values)
            scores = torch.randn(8, 128, 512, generator=g)
            bias = torch.zeros(128, 512).masked_fill_(torch.rand(128, 512, generator=g) < 0.3, float("-inf"))
            want = reference.softmax_bias(scores.clone(), bias)
            assert torch.equal(fused.softmax_bias(scores, bias), want)
            q = torch.randn(512, 8, 128, generator=g)[..., 64:96]
            ang = torch.randn(512, 1, 16, generator=g)
            assert torch.equal(fused.rope(q, ang.cos(), ang.sin()), reference.rope(q, ang.cos(), ang.sin()))
            q, k = torch.randn(128, 8, 96, generator=g), torch.randn(384, 8, 96, generator=g)
            v = torch.randn(384, 8, 128, generator=g)[..., 64:]
            if "glm5_attend_heads" in _enabled():  # its probe checks it on 1 and 2 threads
                want = reference.attend_heads(q, k, v, bias[:, :384].contiguous(), torch.empty(128, 8, 64))
                got = fused.attend_heads(q, k, v, bias[:, :384].contiguous(), torch.empty(128, 8, 64))
                assert torch.equal(got, want)
            # The MoE kernel with two threads, on a layer whose SiLU torch splits between them (800 x 128 values:
            # two runs of 400 rows); its sgemm calls run on torch's BLAS threads, as the grouped GEMM's do.
            # ~100 rows of 192 per expert: the kernel splits its row loops between the two threads too.
            x, out = torch.randn(200, 192, generator=g), torch.randn(200, 192, generator=g)
            gate_up, down = torch.randn(8, 192, 256, generator=g) / 14, torch.randn(8, 128, 192, generator=g) / 11
            idx = torch.stack([torch.randperm(8, generator=g)[:4] for _ in range(200)])
            order = idx.flatten().argsort(stable=True)
            token, counts, wt = order // 4, torch.bincount(idx.flatten(), minlength=8), torch.rand(800, generator=g)
            want = reference.moe_experts(x, token, wt, counts, gate_up, down, out.clone())
            assert torch.equal(fused.moe_experts(x, token, wt, counts, gate_up, down, out), want)
            torch.set_num_threads(3)  # runs of 34134 values: inside rows, where the kernel steps aside
            assert fused.moe_experts(x, token, wt, counts, gate_up, down, out) is None
    finally:
        torch.set_num_threads(before)
