"""Module swapping, as LoRA (peft) and INT4 do it, works on our per-expert nn.Linear layers."""

from __future__ import annotations

import pytest
import torch

from model import GLM5ForCausalLM
from model.moe import MoE
from tests.model.conftest import close, randomize, tiny

peft = pytest.importorskip("peft")


def test_peft_lora_on_attention_and_experts_changes_the_output_and_trains():
    # This also guards GLM5Config having no `model_type` attribute: with one, peft (under transformers 5)
    # rewrites gate_proj/up_proj/down_proj targets for transformers' fused experts and wraps none of ours.
    model = randomize(GLM5ForCausalLM(tiny())).eval()
    ids = torch.randint(0, 8000, (1, 20))
    with torch.no_grad():
        before = model(ids)
    cfg = peft.LoraConfig(r=4, target_modules=["q_b_proj", "kv_b_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.inject_adapter_in_model(cfg, model)
    moe = next(m for m in model.modules() if isinstance(m, MoE))
    with torch.no_grad():
        assert not moe._stacked_ok()  # wrapped experts: the MoE calls the modules, so LoRA is applied
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
        after = model(ids)
    assert not torch.allclose(before, after)
    model(ids).logsumexp(-1).mean().backward()
    lora_grads = [n for n, p in model.named_parameters() if "lora_" in n and p.grad is not None]
    assert any(".experts." in n for n in lora_grads) and any("kv_b_proj" in n for n in lora_grads)


def test_a_swapped_linear_is_used_by_every_path():
    class Doubled(torch.nn.Linear):  # stands in for an INT4 linear: a different module with a dense weight
        def forward(self, x):
            return 2 * super().forward(x)

    model = randomize(GLM5ForCausalLM(tiny())).eval()
    expert = model.model.layers[1].mlp.experts[0]
    old = expert.up_proj
    expert.up_proj = Doubled(old.in_features, old.out_features, bias=False)
    with torch.no_grad():
        expert.up_proj.weight.copy_(old.weight)
        moe = model.model.layers[1].mlp
        x = torch.randn(30, 64)
        moe.impl = "fast"
        auto = moe(x)
        moe.impl = "reference"
        assert close(auto, moe(x), 1e-5)
