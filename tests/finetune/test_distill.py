"""Cross-stage distillation (finetune/distill.py): the report's sampled loss has the full reverse KL's gradient in
expectation, the teacher 'base' is the student with its adapter off, and a domain without a teacher is refused."""

from __future__ import annotations

import pytest
import torch

from finetune.distill import DistillConfig, Prompt, Teacher, adapters_off, distill_loss, train_distill


def test_sampled_loss_is_the_reverse_kl_gradient_in_expectation():
    torch.manual_seed(0)
    logits = torch.randn(7, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(7), -1)[None]
    s = torch.log_softmax(logits, -1)[None]
    # E_{y ~ p_s}[sampled loss] as an exact sum over the 7 tokens, weights p_s(y) held constant (they are samples)
    probs = s.detach().exp()[0]
    expected = sum(probs[y] * distill_loss(s, teacher, torch.tensor([y]), "sampled") for y in range(7))
    (g_sampled,) = torch.autograd.grad(expected, logits, retain_graph=True)
    (g_full,) = torch.autograd.grad(distill_loss(s, teacher, torch.tensor([0]), "full"), logits)
    assert torch.allclose(g_sampled, g_full, atol=1e-6 * float(g_full.abs().max()) + 1e-7)
    assert float(g_full.abs().max()) > 1e-3  # a real gradient, not two zeros


def test_base_teacher_is_the_student_with_its_adapter_off():
    from finetune.lora import LoraSettings, add_lora
    from model.config import preset
    from model.modeling import GLM5ForCausalLM

    net = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        base = net(ids)
        net = add_lora(net, LoraSettings(rank=2), seed=0)
        for n, p in net.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
        assert not torch.allclose(net(ids), base)
        with adapters_off(net):
            assert torch.allclose(net(ids), base, atol=1e-5 * float(base.abs().max()))
        assert not torch.allclose(net(ids), base)
    assert all(p.requires_grad == ("lora_" in n) for n, p in net.named_parameters())
    with pytest.raises(ValueError, match="no teacher for domain"):
        train_distill(net, [Prompt([1, 2], "code")], {"math": Teacher.base()}, DistillConfig(steps=1))
