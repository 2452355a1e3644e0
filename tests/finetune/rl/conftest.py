from __future__ import annotations

import pytest
import torch

from finetune.grpo import RL_TARGETS
from finetune.sft import LoraSettings, add_lora
from model import GLM5ForCausalLM
from model.config import preset
from model.tokenizer import Tokenizer
from tests.agent.bench.conftest import outside_tmp  # noqa: F401 (fixture)

torch.set_num_threads(1)


def peaky_model():
    """`tiny` with its lm_head scaled 20x (a random tiny's logits are all within ~1 of each other; a trained head has
    this range, and then a few steps move it), LoRA on RL_TARGETS, the same weights every time."""
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return add_lora(model, LoraSettings(rank=8, alpha=16, targets=RL_TARGETS), seed=0)


@pytest.fixture(scope="session")
def tok():
    return Tokenizer.shipped()
