"""Our INT4 CPU kernel (model/kernels/int4.py, cpu_int4.c): its layout, its agreement with the plain path (to the
rounding of an fp32 sum, not bit for bit), the loader's probe, the per-machine choice, and Int4Linear on it.

The kernel needs a C compiler and AVX2 / FMA; where it did not build or pass its probe, its own tests are skipped
and Int4Linear runs torch's kernel (the choice and the fallback are tested everywhere)."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch
from torch import nn

from model.compressed_tensors import Int4Tensors
from model.int4_linear import Int4Linear
from model.kernels import build, int4, reference
from model.moe import MLP
from model.quant_int4 import quantize_int4

HAS_CC = shutil.which(os.environ.get("CC", "cc")) is not None
needs_kernel = pytest.mark.skipif(
    not HAS_CC or int4.load() is None, reason=f"our INT4 kernel is not used here ({int4._state.get('note')})"
)


@pytest.fixture
def glm5(monkeypatch):
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", "glm5")


def _weights(n: int, k: int, group: int, seed: int = 0) -> Int4Tensors:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
    return Int4Tensors(q, torch.rand(n, k // group, generator=g) + 0.01, None, group)


def _close(y: torch.Tensor, want: torch.Tensor, x: torch.Tensor, t: Int4Tensors) -> bool:
    """Within the rounding of two fp32 sums of K products (int4.tolerance), relative to |x| @ |W|^T."""
    dense = reference.int4_linear(torch.eye(t.q.shape[1]), t.q, t.scale).t()
    return bool(((y - want).abs() <= int4.tolerance(x.reshape(-1, x.shape[-1]), dense).view(y.shape)).all())


def test_repack_layout_holds_every_nibble_and_scale_where_the_kernel_reads_it():
    """Word (b, k/8, j) holds q[16b + j, k + i] at bits 4i; scales (b, g, j); outputs past N are zeros."""
    t = _weights(40, 64, 32, seed=1)
    w, s = int4.repack(t.q, t.scale)
    assert w.shape == (3, 8, 16) and w.dtype == torch.int32 and s.shape == (3, 2, 16)
    nib = (w.to(torch.int64).unsqueeze(-1) >> (4 * torch.arange(8))) & 0xF  # [Nb, K/8, 16, 8]
    q = torch.where(nib >= 8, nib - 16, nib).permute(0, 2, 1, 3).reshape(48, 64)
    assert torch.equal(q[:40], t.q.long()) and (q[40:] == 0).all()
    assert torch.equal(s.transpose(1, 2).reshape(48, 2)[:40], t.scale) and (s.transpose(1, 2)[2, 8:] == 0).all()
    with pytest.raises(ValueError, match="multiples of 8"):
        int4.repack(torch.zeros(16, 60, dtype=torch.int8), torch.ones(16, 2))


@needs_kernel
@pytest.mark.parametrize("n, k, group", [(256, 768, 128), (72, 256, 32), (8, 512, 64), (48, 256, 256)])
def test_kernel_agrees_with_the_reference_at_every_row_count(n, k, group):
    """Decode's 1 row, the row blocks of 4 and their tails, 16 and 17 rows; N not a multiple of 16; a bias."""
    t = _weights(n, k, group, seed=n)
    w, s = int4.repack(t.q, t.scale)
    g = torch.Generator().manual_seed(2)
    for rows in (1, 2, 3, 4, 5, 7, 16, 17):
        x = torch.randn(rows, k, generator=g) * 10.0 ** float(torch.randint(-3, 4, (), generator=g))
        bias = torch.randn(n, generator=g) if rows == 5 else None
        with torch.inference_mode():
            y = int4.linear(x, w, s, n, group, bias)
        want = reference.int4_linear(x, t.q, t.scale, bias)
        assert y.shape == (rows, n)
        assert _close(y if bias is None else y - bias, want if bias is None else want - bias, x, t), rows
    # rows of a wider tensor, and a column-strided one (copied first)
    xs = torch.randn(3, k + 5, generator=g)[:, 2 : k + 2]
    assert _close(int4.linear(xs, w, s, n, group), reference.int4_linear(xs, t.q, t.scale), xs, t)
    xt = torch.randn(k, 3, generator=g).t()
    assert _close(int4.linear(xt, w, s, n, group), reference.int4_linear(xt, t.q, t.scale), xt, t)


@needs_kernel
def test_threads_split_outputs_and_give_the_same_bits(monkeypatch):
    """Each output is one thread's dot product in the same order, so the thread count never changes a bit."""
    monkeypatch.setattr(build, "PASSIVE", False)
    t = _weights(512, 768, 128, seed=3)
    w, s = int4.repack(t.q, t.scale)
    x = torch.randn(4, 768)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = int4.linear(x, w, s, 512, 128)
        torch.set_num_threads(2)
        two = int4.linear(x, w, s, 512, 128)
        assert int4._state["threads"] == 2
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@needs_kernel
def test_probe_passes_the_kernel_and_rejects_one_that_differs(monkeypatch):
    fn = int4.load()
    assert int4.probe(fn, torch.Generator().manual_seed(0))
    # a reference that drops the last group: the kernel now disagrees with it by whole weights
    monkeypatch.setattr(
        reference, "int4_linear", lambda x, q, s, b=None: torch.nn.functional.linear(x, _drop_last(q, s), b)
    )
    assert not int4.probe(fn, torch.Generator().manual_seed(0))


def _drop_last(q, s):
    w = (q.float().view(q.shape[0], s.shape[1], -1) * s.unsqueeze(-1)).view(q.shape)
    w[:, -q.shape[1] // s.shape[1] :] = 0
    return w


def test_choice_per_machine_and_override(monkeypatch):
    monkeypatch.delenv("GLM5_INT4_CPU_KERNEL", raising=False)
    ours = "glm5" if int4.load() is not None else "tinygemm"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert int4.cpu_kernel() == ours
    assert int4.cpu_kernel(symmetric=False) == "tinygemm"  # asymmetric weights: torch's kernel takes zero points
    assert int4.cpu_kernel(dtype=torch.bfloat16) == "tinygemm"  # torch's kernel is bf16-native
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert int4.cpu_kernel() == "tinygemm"  # what INT4 was tuned and measured on there
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", "glm5")
    assert int4.cpu_kernel() == ours  # asked for, and used where it built and passed its probe
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", "tinygemm")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert int4.cpu_kernel() == "tinygemm"
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", "avx9")
    with pytest.raises(ValueError, match="GLM5_INT4_CPU_KERNEL must be one of"):
        int4.cpu_kernel()


def test_without_a_compiler_int4_layers_run_torch_kernel(monkeypatch, tmp_path):
    saved = dict(int4._state)
    int4._state.clear()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", "glm5")
    try:
        assert int4.load() is None and "no C compiler" in int4.status()
        lin = Int4Linear.from_linear(nn.Linear(128, 32, bias=False), 64)
        assert lin.cpu_kernel == "tinygemm" and lin(torch.randn(2, 128)).shape == (2, 32)
    finally:
        int4._state.clear()
        int4._state.update(saved)


@needs_kernel
def test_int4_linear_on_our_kernel_matches_its_plain_path(glm5):
    """fp32 end to end (no bf16 rounding of x): the plain path's result to the rounding of the sums, for 2-D
    and 3-D inputs, with a bias, and the dequantized weight exactly the plain path's."""
    torch.manual_seed(6)
    lin = nn.Linear(256, 72, bias=True)
    fast = Int4Linear.from_linear(lin, 64, True, "fast")
    plain = Int4Linear.from_linear(lin, 64, True, "plain")
    assert fast.cpu_kernel == "glm5" and "(glm5)" in repr(fast)
    assert torch.equal(fast.dequantize(), plain.dequantize())
    t = plain.int4_tensors()
    for x in (torch.randn(1, 256), torch.randn(16, 256), torch.randn(2, 5, 256)):
        with torch.no_grad():
            y, want = fast(x), plain(x)
        assert y.shape == want.shape and y.dtype == torch.float32
        assert _close(y - fast.bias, want - plain.bias, x, t)
    # bf16 inputs are computed in fp32 and returned in bf16
    assert fast(torch.randn(3, 256, dtype=torch.bfloat16)).dtype == torch.bfloat16


@needs_kernel
def test_gradients_flow_to_the_input_through_the_dense_weight(glm5):
    """The kernel has no backward: with autograd on an input that needs a gradient the layer multiplies by its
    dequantized weight instead (QLoRA-style training), with the plain path's gradient."""
    torch.manual_seed(7)
    lin = nn.Linear(128, 32, bias=False)
    fast, plain = (Int4Linear.from_linear(lin, 32, True, impl) for impl in ("fast", "plain"))
    x1, x2 = (torch.randn(3, 128, generator=torch.Generator().manual_seed(1)).requires_grad_() for _ in range(2))
    fast(x1).square().sum().backward()
    plain(x2).square().sum().backward()
    assert torch.allclose(x1.grad, x2.grad, rtol=1e-5, atol=1e-5 * x2.grad.abs().max().item())


@needs_kernel
def test_gate_and_up_pair_on_our_kernel_is_one_call_with_the_same_bits(glm5, monkeypatch):
    """The pair concatenates the two layers' blocks of 16 rows (any row count: 72 pads to 80), one kernel call
    for both, the bits of the two calls; the layers' packed weights become views of the pair's buffer."""
    torch.manual_seed(8)
    real = int4.linear
    for inter in (128, 72):
        mlp = quantize_int4(MLP(256, inter), group_size=64, strict=False)  # 72: down_proj stays dense
        pair = mlp.__dict__.get("int4_gate_up")
        assert pair is not None and pair.glm5 and pair.current(mlp)
        assert mlp.up_proj.int4_w.untyped_storage().data_ptr() == pair.pack.untyped_storage().data_ptr()
        calls: list[int] = []
        monkeypatch.setattr(int4, "linear", lambda *a, calls=calls, real=real: calls.append(1) or real(*a))
        for rows in (1, 5):
            x = torch.randn(rows, 256)
            with torch.no_grad():
                calls.clear()
                fused = mlp(x)
                assert len(calls) == (2 if inter == 128 else 1)  # gate|up, then down
                apart = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
            assert torch.equal(fused, apart)
        monkeypatch.setattr(int4, "linear", real)


@needs_kernel
def test_a_quantized_model_predicts_the_same_tokens_on_either_kernel(monkeypatch):
    """The tiny GLM-5 quantized twice, on our kernel and on torch's: greedy tokens of a prefill agree (the same
    int4 weights; torch's kernel rounds activations to bf16, so the logits agree only roughly)."""
    from model import GLM5ForCausalLM
    from model.kv_cache import KVCache
    from tests.model.conftest import randomize, tiny

    cfg = tiny()
    base = randomize(GLM5ForCausalLM.from_config(cfg, seed=0)).eval()
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    logits = {}
    for kernel in ("glm5", "tinygemm"):
        monkeypatch.setenv("GLM5_INT4_CPU_KERNEL", kernel)
        m = quantize_int4(copy.deepcopy(base), group_size=32, strict=False, mse=False)
        assert {x.cpu_kernel for x in m.modules() if isinstance(x, Int4Linear)} == {kernel}
        with torch.inference_mode():
            logits[kernel] = m(ids, cache=KVCache.for_config(cfg))[0].float()
    a, b = logits["glm5"], logits["tinygemm"]
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9
    assert (a - b).abs().max() < 0.05 * b.abs().max()
