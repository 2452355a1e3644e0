"""Cross-stage distillation (finetune/distill.py): the report's sampled loss has the full reverse KL's gradient in
expectation, the teacher 'base' is the student with its adapter off, and a domain without a teacher is refused."""

from __future__ import annotations

import random

import pytest
import torch

from finetune.distill import (
    DistillConfig,
    Prompt,
    Teacher,
    adapters_off,
    completion_logprobs,
    distill_loss,
    train_distill,
)
from finetune.train_loop import OptimConfig


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
    cfg = DistillConfig(OptimConfig(steps=1, lr=1e-4, warmup=5))
    with pytest.raises(ValueError, match="no teacher for domain"):
        train_distill(net, [Prompt([1, 2], "code")], {"math": Teacher.base()}, cfg)


def test_batched_sampling_is_each_prompt_sampled_alone():
    from finetune.distill import sample_batch
    from model.config import preset
    from model.modeling import GLM5ForCausalLM

    net = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        net.lm_head.weight.mul_(20.0)  # peaky, so that greedy choices are not near-ties
    prompts = [[5, 6], [7, 8], [9, 10, 11]]
    alone = [sample_batch(net, [p], 4, 0.0, None)[0] for p in prompts]
    assert sample_batch(net, prompts, 4, 0.0, None) == alone
    stop = alone[0][1]  # the first prompt stops after its second token; a row that stops is not extended
    cut = [c[: c.index(stop) + 1] if stop in c else c for c in alone]
    assert len(cut[0]) == 2 and sample_batch(net, prompts, 4, 0.0, None, stop=(stop,)) == cut
    # the KV-cached decode picks what recomputing the whole prefix each token picks
    for p, got in zip(prompts, alone, strict=True):
        ids = list(p)
        for _ in range(4):
            ids.append(int(net(torch.tensor([ids]))[0, -1].argmax()))
        assert ids[len(p) :] == got


# Two skills on a tiny model: after tag A or B and an index, answer that index's 3 tokens and EOS. The skills
# share their index tokens, so training B pulls A's answers towards B's: a later stage that makes an earlier
# skill forget, as GLM-5's sequential RL stages do.
EOS = 8129


def _skill(tag: int, seed: int, n: int = 8) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    return [([tag, 100 + i], [rng.randrange(200, 8000) for _ in range(3)] + [EOS]) for i in range(n)]


@torch.no_grad()
def _loglik(net, skill) -> float:
    """Mean log-probability per answer token (teacher-forced): 0 when the skill is perfect."""
    net.eval()
    lls = [completion_logprobs(net, p, a).gather(-1, torch.tensor(a)[:, None]).mean() for p, a in skill]
    return float(sum(lls) / len(lls))


@pytest.mark.slow
def test_distillation_from_the_earlier_stage_brings_back_a_skill_the_later_stage_lost():
    """Stage 1 learns skill A, stage 2 learns skill B and loses much of A; distilling the stage-2 model (LoRA)
    from the stage-1 checkpoint on A's prompts, with its own base as the teacher of B's, brings A back and
    keeps B: the report's cross-stage distillation, with the default estimator (kl="full")."""
    import copy

    from finetune.full import prepare_full
    from finetune.lora import LoraSettings, add_lora
    from finetune.sft import SFTConfig, train_sft
    from model.config import preset
    from model.modeling import GLM5ForCausalLM

    skill_a, skill_b = _skill(10, 1), _skill(20, 2)
    net = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        net.lm_head.weight.mul_(20.0)  # a trained model's logit range (see tests/glm5cli/test_finetune_sft.py)
    named = prepare_full(net)
    train_sft(
        net,
        [(p + a, len(p)) for p, a in skill_a],
        SFTConfig(OptimConfig(steps=30, lr=3e-3, warmup=3), batch_size=8),
        named=named,
    )
    stage_a = copy.deepcopy(net)
    skill_a, skill_b = skill_a[:4], skill_b[:4]  # distilled and measured on half the prompts: the test's time
    a1 = _loglik(net, skill_a)
    train_sft(
        net,
        [(p + a, len(p)) for p, a in skill_b],
        SFTConfig(OptimConfig(steps=20, lr=1e-3, warmup=3), batch_size=8),
        named=named,
    )
    a2, b2 = _loglik(net, skill_a), _loglik(net, skill_b)
    assert a1 > -0.05 and b2 > -0.05 and a2 < a1 - 1.0, (a1, a2, b2)  # A learned, B learned, A largely lost

    student = add_lora(net, LoraSettings(rank=8, alpha=16), seed=0)
    prompts = [Prompt(p, "a") for p, _ in skill_a] + [Prompt(p, "b") for p, _ in skill_b]
    teachers = {"a": Teacher.checkpoint(stage_a), "b": Teacher.base()}
    cfg = DistillConfig(OptimConfig(steps=30, lr=3e-3, warmup=2), prompts_per_step=8, max_new_tokens=4)
    train_distill(student, prompts, teachers, cfg, stop=(EOS,))
    a3, b3 = _loglik(student, skill_a), _loglik(student, skill_b)
    assert (a3 - a2) > 0.75 * (a1 - a2), (a1, a2, a3)  # most of A came back
    assert b3 > b2 - 0.25, (b2, b3)  # and B was kept
