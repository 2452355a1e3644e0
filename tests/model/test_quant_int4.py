"""INT4 weight-only quantization: numerics, the fast kernels against the plain path, module swapping."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from model.compressed_tensors import Int4Scheme
from model.int4_gate_up import Int4GateUp
from model.int4_linear import Int4Linear
from model.int4_numerics import dequantize_weight, quantize_weight
from model.moe import MLP
from model.quant_int4 import DEFAULT_SKIP, is_skipped, quantize_int4, weight_bytes


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_round_to_nearest_error_is_at_most_half_a_step(symmetric, group_size):
    torch.manual_seed(0)
    w = torch.randn(40, 256) * torch.linspace(0.1, 3, 256)  # groups with very different ranges
    t = quantize_weight(w, group_size, symmetric, mse=False)
    assert t.q.dtype == torch.int8 and int(t.q.min()) >= -8 and int(t.q.max()) <= 7
    assert t.scale.shape == (40, 256 // group_size)
    assert (t.zero_point is None) == symmetric
    err = (dequantize_weight(t) - w).abs().view(40, -1, group_size)
    step = t.scale.unsqueeze(-1)
    assert (err <= step / 2 + 1e-6).all()
    # and the grid is really used: round to nearest on a fine grid averages about a quarter step
    assert (err / step).mean() < 0.3


@pytest.mark.parametrize("symmetric", [True, False])
def test_mse_range_search_never_loses_to_minmax(symmetric):
    torch.manual_seed(12)
    w = torch.distributions.StudentT(3.0).sample((64, 256))  # heavy tails: a few outliers per group
    err = {}
    for mse in (False, True):
        t = quantize_weight(w, 128, symmetric, mse=mse)
        err[mse] = (dequantize_weight(t) - w).pow(2).view(64, 2, 128).sum(-1)
    assert (err[True] <= err[False] + 1e-6).all()  # per group: 1.0 is one of the candidates
    assert err[True].sum() < 0.95 * err[False].sum()  # and clipping the outliers really pays here


def test_q_is_computed_against_the_stored_bf16_scale():
    torch.manual_seed(13)
    w = torch.randn(32, 256)
    t = quantize_weight(w, 128, True, mse=False, scale_dtype=torch.bfloat16)
    assert t.scale.dtype == torch.bfloat16
    step = t.scale.float().unsqueeze(-1)
    err = (dequantize_weight(t) - w).abs().view(32, 2, 128)
    # half a step of the *stored* scale, except where +max clips to 7 steps (at most a step there)
    assert (err <= step * 0.5 + 1e-6).float().mean() > 0.99 and (err <= step + 1e-6).all()


def test_asymmetric_fits_one_sided_groups_better():
    w = torch.rand(16, 128) + 1.0  # all positive: symmetric wastes half of its 16 levels
    e_sym = (dequantize_weight(quantize_weight(w, 32, True)) - w).abs().mean()
    e_asym = (dequantize_weight(quantize_weight(w, 32, False)) - w).abs().mean()
    assert e_asym < e_sym / 2


def test_zero_is_exact_and_constant_groups_do_not_divide_by_zero():
    w = torch.zeros(16, 64)
    w[0, :32] = 0.5
    for sym in (True, False):
        t = quantize_weight(w, 32, sym)
        deq = dequantize_weight(t)
        assert torch.isfinite(deq).all()
        assert (deq[1:] == 0).all() and (deq[0, 32:] == 0).all()
        # asymmetric has a level at max; symmetric (max / 7.5, as compressed-tensors) clips +max to 7 steps
        expected = 0.5 * 7 / 7.5 if sym else 0.5
        assert torch.allclose(deq[0, :32], torch.full((32,), expected), atol=1e-6)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("out_features", [64, 72])  # 72: not a multiple of the CPU kernel's 16, so padded
@pytest.mark.parametrize("kernel", ["tinygemm", "glm5"])  # glm5: where this machine built it, else tinygemm
def test_fast_kernel_agrees_with_plain_path(symmetric, group_size, out_features, kernel, monkeypatch):
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", kernel)
    torch.manual_seed(1)
    lin = nn.Linear(256, out_features, bias=True)
    fast = Int4Linear.from_linear(lin, group_size, symmetric, impl="fast")
    plain = Int4Linear.from_linear(lin, group_size, symmetric, impl="plain")
    x = torch.randn(2, 5, 256)
    y_fast, y_plain = fast(x), plain(x)
    assert y_fast.shape == (2, 5, out_features) and y_fast.dtype == torch.float32
    # The kernel runs in bf16: compare against the plain path on bf16-rounded inputs, at bf16 tolerance.
    y_ref = plain(x.bfloat16().float())
    assert torch.allclose(y_fast, y_ref, rtol=2e-2, atol=2e-2 * y_ref.abs().max().item())
    assert (y_fast - y_plain).abs().max() < 0.02 * y_plain.abs().max()
    # Both are a quantization of the original layer, not something else.
    y = lin(x)
    assert (y_plain - y).abs().max() < 0.15 * y.abs().max()
    # The dense weights the two paths multiply by match (bf16 scales on the fast side).
    assert torch.allclose(fast.dequantize(), plain.dequantize(), atol=2e-2 * plain.dequantize().abs().max().item())


def test_fast_kernel_batch_16_and_single_row(tinygemm):
    torch.manual_seed(2)
    lin = nn.Linear(512, 128, bias=False)
    fast = Int4Linear.from_linear(lin, 128, True, "fast")
    plain = Int4Linear.from_linear(lin, 128, True, "plain")
    for x in (torch.randn(1, 512), torch.randn(16, 512)):
        xb = x.bfloat16().float()
        assert torch.allclose(fast(x), plain(xb), rtol=2e-2, atol=2e-2)


def test_bf16_model_stays_bf16():
    lin = nn.Linear(128, 32).to(torch.bfloat16)
    for impl in ("fast", "plain"):
        q = Int4Linear.from_linear(lin, 64, True, impl)
        assert q(torch.randn(3, 128, dtype=torch.bfloat16)).dtype == torch.bfloat16
        assert q.dense_weight().dtype == torch.bfloat16


def test_plain_state_dict_is_the_checkpoint_entry():
    lin = nn.Linear(64, 24, bias=False)
    sym = Int4Linear.from_linear(lin, 32, True, "plain").state_dict()
    assert set(sym) == {"weight_packed", "weight_scale", "weight_shape"}
    assert sym["weight_packed"].dtype == torch.int32 and sym["weight_packed"].shape == (24, 8)
    assert sym["weight_scale"].shape == (24, 2) and sym["weight_shape"].tolist() == [24, 64]
    asym = Int4Linear.from_linear(lin, 32, False, "plain").state_dict()
    assert asym["weight_zero_point"].shape == (3, 2) and asym["weight_zero_point"].dtype == torch.int32
    # The fast layout is kernel-private: nothing of it is saved.
    assert set(Int4Linear.from_linear(lin, 32, True, "fast").state_dict()) == set()


def test_bad_arguments_are_named():
    lin = nn.Linear(96, 16)
    with pytest.raises(ValueError, match="multiple of group_size"):
        Int4Linear.from_linear(lin, 64, True, "fast")
    with pytest.raises(ValueError, match="impl must be one of"):
        Int4Linear.from_linear(lin, 32, True, "triton")
    with pytest.raises(ValueError, match="group_size must be one of"):
        quantize_int4(nn.Sequential(lin), group_size=48)
    with pytest.raises(ValueError, match=r"0: in_features 96"):
        quantize_int4(nn.Sequential(lin), group_size=64)
    q = Int4Linear.from_linear(nn.Linear(64, 16), 32)
    with pytest.raises(ValueError, match="expects last dim 64"):
        q(torch.randn(2, 32))
    # Odd in_features cannot use the kernels but the plain path takes them (ragged last group).
    odd = Int4Linear.from_linear(nn.Linear(70, 16), 32, True, "plain")
    assert odd(torch.randn(2, 70)).shape == (2, 16)


class Expert(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            nn.Linear(d, f, False),
            nn.Linear(d, f, False),
            nn.Linear(f, d, False),
        )

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, d, e):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(e, d) * 0.1)
        self.register_buffer("e_score_correction_bias", torch.zeros(e))


class Indexer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.wq_b, self.wk, self.weights_proj = nn.Linear(d, d, False), nn.Linear(d, 32, False), nn.Linear(d, 4, False)
        self.k_norm = nn.LayerNorm(32)


class Layer(nn.Module):
    """GLM-5-named pieces: attention projections, indexer, router, experts ModuleList, shared expert."""

    def __init__(self, d=64, f=32, e=4):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d)
        self.self_attn = nn.Module()
        self.self_attn.q_a_proj = nn.Linear(d, d, False)
        self.self_attn.indexer = Indexer(d)
        self.mlp = nn.Module()
        self.mlp.gate = Router(d, e)
        self.mlp.experts = nn.ModuleList([Expert(d, f) for _ in range(e)])
        self.mlp.shared_experts = Expert(d, f)

    def forward(self, h):
        x = self.input_layernorm(h)
        x = x + self.self_attn.q_a_proj(x) + self.self_attn.indexer.wq_b(x)
        scores = (x @ self.mlp.gate.weight.t()).softmax(-1)
        routed = sum(scores[..., i : i + 1] * ex(x) for i, ex in enumerate(self.mlp.experts))
        return h + routed + self.mlp.shared_experts(x)


class TinyLM(nn.Module):
    def __init__(self, vocab=48, d=64):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, d)
        self.model.layers = nn.ModuleList([Layer(d), Layer(d)])
        self.model.layers[1].eh_proj = nn.Linear(2 * d, d, False)  # an MTP-style projection
        self.lm_head = nn.Linear(d, vocab, False)

    def forward(self, ids):
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h)
        return self.lm_head(h)


def test_quantize_int4_swaps_linears_and_keeps_the_fp8_split_in_high_precision():
    torch.manual_seed(3)
    ref = TinyLM()
    model = TinyLM()
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 48, (2, 7))
    quantize_int4(model, group_size=32)
    swapped = {n for n, m in model.named_modules() if isinstance(m, Int4Linear)}
    kept = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert kept == {
        "lm_head",
        "model.layers.0.self_attn.indexer.weights_proj",
        "model.layers.1.self_attn.indexer.weights_proj",
        "model.layers.0.self_attn.indexer.wk",  # vLLM fuses it with weights_proj, unquantized
        "model.layers.1.self_attn.indexer.wk",
        "model.layers.1.eh_proj",
    }
    assert (
        "model.layers.0.mlp.experts.3.down_proj" in swapped and "model.layers.1.mlp.shared_experts.up_proj" in swapped
    )
    assert "model.layers.0.self_attn.indexer.wq_b" in swapped and len(swapped) == 2 * (1 + 1 + 5 * 3)
    assert isinstance(model.model.layers[0].mlp.gate, Router)  # the router is not a Linear and stays as is
    assert isinstance(model.model.embed_tokens, nn.Embedding)
    with torch.no_grad():
        y, y_ref = model(ids), ref(ids)
    assert (y - y_ref).abs().max() < 0.1 * y_ref.abs().max()
    # The skip list is configurable: an empty one quantizes lm_head too.
    quantize_int4(model, group_size=32, skip=())
    assert isinstance(model.lm_head, Int4Linear)


@pytest.fixture
def tinygemm(monkeypatch):
    """Fast CPU layers built in the test run torch's int4 kernel, whatever this machine would choose (on AVX2
    CPUs it is our own kernel: tests/model/test_int4_kernel.py)."""
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", "tinygemm")


def test_gate_and_up_run_as_one_kernel_call_with_the_same_bits(tinygemm):
    """quantize_int4 pairs an MLP's gate_proj and up_proj (Int4GateUp): one kernel call at inference, their
    packed weights views of one buffer (nothing stored twice), the output bit-identical to two calls; a module
    swapped in afterwards makes the MLP use its modules again. Rows not in whole blocks of the CPU layout (64)
    are not paired."""
    torch.manual_seed(3)
    mlp = quantize_int4(MLP(256, 128), group_size=32)
    pair = mlp.__dict__.get("int4_gate_up")
    assert isinstance(pair, Int4GateUp) and pair.current(mlp)
    assert mlp.gate_proj.int4pack.data_ptr() == pair.pack.data_ptr()
    assert mlp.up_proj.int4pack.untyped_storage().data_ptr() == pair.pack.untyped_storage().data_ptr()
    for rows in (1, 5):
        x = torch.randn(rows, 256)
        with torch.no_grad():
            fused = mlp(x)
            apart = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        assert torch.equal(fused, apart)
    calls = []
    real = torch.ops.aten._weight_int4pack_mm_for_cpu
    x = torch.randn(1, 256)
    with torch.no_grad():
        torch.ops.aten._weight_int4pack_mm_for_cpu = lambda *a: calls.append(1) or real(*a)
        try:
            mlp(x)
        finally:
            torch.ops.aten._weight_int4pack_mm_for_cpu = real
    assert len(calls) == 2  # gate|up, then down
    mlp.up_proj = Int4Linear.from_linear(nn.Linear(256, 128, bias=False), 32)
    assert not pair.current(mlp)
    with torch.no_grad():
        want = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        assert torch.equal(mlp(x), want)
    small = quantize_int4(MLP(64, 32), group_size=32)  # 32 rows: half a block
    assert "int4_gate_up" not in small.__dict__


def test_default_skip_names():
    for name in ("lm_head", "model.layers.3.mlp.gate", "model.layers.3.self_attn.indexer.weights_proj",
                 "model.layers.3.self_attn.indexer.wk", "model.layers.78.eh_proj"):  # fmt: skip
        assert is_skipped(name, DEFAULT_SKIP), name
    for name in ("model.layers.3.mlp.gate_proj", "model.layers.3.mlp.experts.0.gate_proj",
                 "model.layers.3.self_attn.indexer.wq_b", "model.layers.3.self_attn.kv_b_proj"):  # fmt: skip
        assert not is_skipped(name, DEFAULT_SKIP), name


def test_weight_bytes_of_g128_are_under_0_30_of_bf16():
    d = 512
    model = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)).to(torch.bfloat16)
    bf16 = weight_bytes(model)["total"]
    quantize_int4(model, group_size=128)
    b = weight_bytes(model)
    assert b["dense"] == 0
    assert b["int4"] <= 0.30 * bf16
    assert b["int4"] >= 0.25 * bf16  # the scales are really counted


def test_dense_weight_for_absorption_matches_what_forward_multiplies():
    torch.manual_seed(4)
    lin = nn.Linear(64, 48, bias=False)
    for impl in ("fast", "plain"):
        q = Int4Linear.from_linear(lin, 32, False, impl)
        x = torch.randn(3, 64).bfloat16().float()
        w = q.dense_weight()
        assert w.shape == (48, 64) and w.dtype == torch.float32
        assert torch.allclose(x @ w.t(), q(x), rtol=2e-2, atol=2e-2)
        assert q.dense_weight() is w  # built once


def test_from_checkpoint_rejects_inconsistent_shapes():
    from model.compressed_tensors import CompressedTensorsError, compress

    t = quantize_weight(torch.randn(16, 64), 32, True)
    tensors = compress(t)
    tensors["weight_scale"] = tensors["weight_scale"][:, :1]
    with pytest.raises(CompressedTensorsError, match="weight_scale: shape"):
        Int4Linear.from_checkpoint(tensors, Int4Scheme(32, True), where="m")


@pytest.mark.gpu
def test_cuda_kernel_agrees_with_plain_path():
    torch.manual_seed(5)
    for sym in (True, False):
        lin = nn.Linear(1024, 264, bias=True).cuda().to(torch.bfloat16)
        fast = Int4Linear.from_linear(lin, 128, sym, "fast")
        plain = Int4Linear.from_linear(lin, 128, sym, "plain")
        x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
        y_fast, y_plain = fast(x).float(), plain(x).float()
        assert (y_fast - y_plain).abs().max() < 0.02 * y_plain.abs().max()


def test_a_paired_mlp_keeps_its_pair_through_deepcopy_and_training(tinygemm):
    """The pairing is the MLP's own forward (set by fuse_gate_up, the class untouched): a deep copy runs its own
    pair on its own weights, and with autograd on the MLP runs its modules."""
    import copy

    torch.manual_seed(4)
    mlp = quantize_int4(MLP(256, 128), group_size=32)
    twin = copy.deepcopy(mlp)
    assert twin.forward.__self__ is twin and twin.__dict__["int4_gate_up"].current(twin)
    x = torch.randn(3, 256)
    calls = []
    real = torch.ops.aten._weight_int4pack_mm_for_cpu
    torch.ops.aten._weight_int4pack_mm_for_cpu = lambda *a: calls.append(1) or real(*a)
    try:
        with torch.no_grad():
            assert torch.equal(twin(x), mlp(x)) and len(calls) == 4  # gate|up and down, in each
        calls.clear()
        mlp(x)  # autograd on: gate, up and down apart
        assert len(calls) == 3
    finally:
        torch.ops.aten._weight_int4pack_mm_for_cpu = real


@pytest.mark.parametrize("kernel", ["tinygemm", "glm5"])
def test_a_low_rank_adapter_is_served_beside_the_int4_weight(kernel, monkeypatch):
    """set_low_rank: the layer computes W_int4 x + B (A x): the adapter's change exactly, not the merge rounded
    anew; on every path (a single row, a batch, the gate|up pair, the dense weight MLA absorption reads); None
    gives back the bits of the bare layer; factors of another shape are refused."""
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", kernel)
    torch.manual_seed(5)
    mlp = quantize_int4(MLP(256, 128), group_size=32)
    x = torch.randn(5, 256)
    with torch.no_grad():
        bare = [mlp.gate_proj(x), mlp.up_proj(x), mlp(x), mlp(x[:1])]
        w_gate = mlp.gate_proj.dequantize()
        a, b = torch.randn(4, 256) * 0.1, torch.randn(128, 4) * 0.1
        mlp.gate_proj.set_low_rank(a, b)
        mlp.up_proj.set_low_rank(a, -b)
        want_gate = mlp.gate_proj._forward_int4(x) + x @ (b @ a).t()
        assert torch.allclose(mlp.gate_proj(x), want_gate, atol=1e-5)
        assert not torch.allclose(mlp.gate_proj(x), bare[0], atol=1e-3)  # it really changed
        up = mlp.up_proj(x)
        for rows in (x, x[:1]):
            g, u = mlp.gate_proj(rows), mlp.up_proj(rows)
            assert torch.allclose(mlp(rows), mlp.down_proj(torch.nn.functional.silu(g) * u), atol=1e-5)
        assert torch.allclose(mlp.gate_proj.dense_weight(), w_gate + b @ a, atol=1e-6)
        mlp.gate_proj.set_low_rank(None)
        mlp.up_proj.set_low_rank(None)
        assert torch.equal(mlp.gate_proj(x), bare[0]) and torch.equal(mlp.up_proj(x), bare[1])
        assert torch.equal(mlp(x), bare[2]) and torch.equal(mlp(x[:1]), bare[3])
        assert torch.equal(mlp.gate_proj.dense_weight(), w_gate)
        assert not torch.allclose(up, bare[1], atol=1e-3)
    with pytest.raises(ValueError, match="do not fit"):
        mlp.gate_proj.set_low_rank(torch.zeros(4, 128), torch.zeros(128, 4))


def test_round_like_int4_gives_the_weights_int4_serving_multiplies_by():
    """round_like_int4 rounds, in full precision, exactly the linears quantize_int4(strict=False) swaps, to the
    weights those Int4Linears multiply by: the model computes what the INT4-served one does, and still trains."""
    import copy

    from model.quant_int4 import round_like_int4

    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(256, 96, bias=False), nn.Linear(96, 256, bias=False))  # 96: not groupable
    rounded = copy.deepcopy(model)
    names = round_like_int4(rounded, group_size=128)
    served = quantize_int4(copy.deepcopy(model), group_size=128, strict=False, impl="plain")
    assert names == ["0"] and isinstance(served[0], Int4Linear) and not isinstance(served[1], Int4Linear)
    assert torch.equal(rounded[0].weight, served[0].dequantize())
    assert torch.equal(rounded[1].weight, model[1].weight)
    assert not torch.equal(rounded[0].weight, model[0].weight)
    assert rounded[0].weight.requires_grad
