"""INT4 QAT (finetune/qat.py): the fake-quantized forward is the served INT4 matmul, its gradient is
straight-through, the swap covers exactly what an INT4 checkpoint quantizes, and QAT brings the served INT4
model closer to full precision than quantizing after training does."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from finetune.full import prepare_full
from finetune.qat import Int4FakeQuantLinear, QATSettings, apply_qat, qat_targets, remove_qat
from finetune.sft import SFTConfig, train_sft
from finetune.train_loop import OptimConfig
from model.config import preset
from model.int4_linear import Int4Linear
from model.int4_numerics import dequantize_weight, fake_quantize_weight, quantize_weight
from model.modeling import GLM5ForCausalLM
from model.quant_int4 import quantize_int4


def _linear(k=96, n=40, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n)
    with torch.no_grad():
        lin.weight[3, 5] = 0.9  # an outlier: the MSE range search clips differently from min/max
    return lin


@pytest.mark.parametrize("group_size", [32, 64])
def test_fake_quant_forward_is_the_dequantized_int4_matmul(group_size):
    lin = _linear()
    fq = Int4FakeQuantLinear(copy.deepcopy(lin), QATSettings(group_size=group_size))
    x = torch.randn(5, 96)
    # dequant(quant(W)) with the quantizer `glm5 model quantize` uses (fp32 weights keep fp32 scales)...
    w_q = dequantize_weight(quantize_weight(lin.weight.detach(), group_size, scale_dtype=torch.float32))
    assert torch.equal(fq.quantized_weight().detach(), w_q)
    torch.testing.assert_close(fq(x), F.linear(x, w_q, lin.bias), rtol=0, atol=0)
    assert not torch.equal(w_q, lin.weight)  # the rounding is real
    # ...which is what the served module multiplies by (the plain INT4 path: the checkpoint's tensors).
    served = Int4Linear.from_linear(lin, group_size, impl="plain")
    torch.testing.assert_close(fq(x), served(x), rtol=1e-6, atol=1e-6 * float(served(x).abs().max()))


def test_the_gradient_is_straight_through():
    """dL/dW is the gradient of a linear with the quantized weight, taken as if the rounding were the identity."""
    lin = _linear()
    fq = Int4FakeQuantLinear(lin, QATSettings(group_size=32))
    x, g = torch.randn(7, 96), torch.randn(7, 40)
    (fq(x) * g).sum().backward()
    torch.testing.assert_close(lin.weight.grad, g.t() @ x)
    torch.testing.assert_close(lin.bias.grad, g.sum(0))


def test_the_swap_covers_what_an_int4_checkpoint_quantizes_and_keeps_the_parameters(tmp_path):
    from model.compressed_tensors import packed_modules, read_tensors
    from model.int4_write import quantize_checkpoint

    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    model.save_pretrained(tmp_path / "fp")
    quantize_checkpoint(tmp_path / "fp", tmp_path / "int4", group_size=32)
    quantized = packed_modules(read_tensors(tmp_path / "int4").keys())
    params = dict(model.named_parameters())
    targets = qat_targets(model, QATSettings(group_size=32))
    names = apply_qat(model, QATSettings(group_size=32))
    assert set(names) == set(targets) == set(quantized)
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in model.named_parameters())  # the same Parameters: optimizer, checkpoints
    assert remove_qat(model) == len(names)
    assert not any(isinstance(m, Int4FakeQuantLinear) for m in model.modules())
    assert all(p is params[n] for n, p in model.named_parameters())
    with pytest.raises(ValueError, match="group size"):
        QATSettings(group_size=48)


def test_lora_qat_fake_quantizes_the_merged_weight_that_int4_will_store():
    """With LoRA, INT4 stores W + scaling * B A after the merge: the QAT forward multiplies by exactly its
    fake-quantized value, and the gradient reaches the adapter (not the frozen base)."""
    from finetune.lora import LoraSettings, add_lora, merge_lora

    model = add_lora(GLM5ForCausalLM.from_config(preset("tiny"), seed=0), LoraSettings(rank=4, alpha=8))
    name = "model.layers.0.self_attn.q_a_proj"
    layer = model.get_submodule(name)
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(0, 0.05)  # peft starts B at zero: make the delta real
    s = QATSettings(group_size=32)
    assert name in apply_qat(model, s)
    a, b, scaling = layer.lora_A["default"].weight, layer.lora_B["default"].weight, layer.scaling["default"]
    w_q = fake_quantize_weight((layer.base_layer.weight + (b @ a) * scaling).detach(), 32)
    x = torch.randn(3, 64)
    y = layer(x)
    torch.testing.assert_close(y, F.linear(x, w_q), rtol=1e-5, atol=1e-6)
    y.sum().backward()
    assert a.grad.abs().sum() > 0 and b.grad.abs().sum() > 0 and layer.base_layer.weight.grad is None
    remove_qat(model)
    merged = merge_lora(model).get_submodule(name).weight.detach()
    assert torch.equal(fake_quantize_weight(merged, 32), w_q)  # peft's merge is the sum QAT quantized


# ---- QAT vs post-training quantization -------------------------------------------------------------------------


def _counting(start: int, n: int = 16, lo: int = 100, span: int = 48) -> list[int]:
    return [lo + (start + i) % span for i in range(n)]


def _perplexity(model, seqs) -> float:
    model.eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            nll += float(F.cross_entropy(model(ids)[0, :-1].float(), ids[0, 1:], reduction="sum"))
            n += len(s) - 1
    return math.exp(nll / n)


def _sft(base, seqs, qat: QATSettings | None):
    """Full SFT (`--full`'s parameters), with or without QAT, on (ids, prompt length 1) sequences."""
    model = copy.deepcopy(base)
    if qat is not None:
        apply_qat(model, qat)
    named = prepare_full(model)
    cfg = SFTConfig(OptimConfig(steps=30, lr=3e-3, warmup=2), batch_size=4)
    train_sft(model, [(s, 1) for s in seqs], cfg, named=named)
    remove_qat(model)
    return model


@pytest.mark.slow
def test_qat_brings_the_int4_model_closer_to_full_precision_than_ptq():
    """`tiny` learns to count (token a -> a + 1, over 48 tokens); held-out sequences start elsewhere. Its linears
    have one large weight per INT4 group, as trained LLMs have outlier weights: the group's scale is set by the
    outlier, so the small weights, where the fine-tuning lives, round coarsely. Served in INT4 (group 32:
    tiny's linears are 32-128 wide), the QAT model's perplexity is closer to the full-precision SFT model's
    than the same SFT quantized after training (PTQ). Measured (Zen 3, loaded): fp 24.4, PTQ 42.2, QAT 24.9."""
    s = QATSettings(group_size=32)
    base = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        base.lm_head.weight.mul_(20.0)  # a trained model's logit range (see test_finetune_sft's `ckpt`)
        for name in qat_targets(base, s):
            w = base.get_submodule(name).weight
            w[:, :: s.group_size] = 0.3 * (torch.randint(0, 2, w[:, :: s.group_size].shape, generator=g) * 2 - 1)
    g = torch.Generator().manual_seed(0)
    train = [_counting(int(torch.randint(0, 48, (1,), generator=g))) for _ in range(16)]
    held_out = [_counting(start) for start in (3, 17, 29, 41)]
    fp = _sft(base, train, None)
    qat = _sft(base, train, s)

    def int4(m):  # what `glm5 serve` runs: the fast INT4 kernels, bf16 activations
        return quantize_int4(copy.deepcopy(m), group_size=s.group_size, strict=False)

    ppl_fp, ppl_ptq, ppl_qat = (_perplexity(m, held_out) for m in (fp, int4(fp), int4(qat)))
    assert _perplexity(base, held_out) > 10 * ppl_fp  # the SFT learned the task
    assert abs(ppl_qat - ppl_fp) < 0.25 * abs(ppl_ptq - ppl_fp), (ppl_fp, ppl_ptq, ppl_qat)
    assert ppl_qat < ppl_ptq
