"""Bad input gets a one-line error that names the problem."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import GLM5Config, GLM5ForCausalLM
from model.checkpoint import CheckpointError
from model.config import ConfigError
from tests.model.conftest import tiny


def _one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


@pytest.fixture
def ckpt(tmp_path):
    GLM5ForCausalLM.from_config(tiny(), seed=0).save_pretrained(tmp_path)
    return tmp_path


def test_config_without_a_required_field(tmp_path):
    raw = tiny().to_dict()
    del raw["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        GLM5Config.from_pretrained(tmp_path)
    assert "hidden_size" in _one_line(e)


def test_config_with_a_wrong_value(tmp_path):
    raw = tiny().to_dict() | {"num_experts_per_tok": "two"}
    with pytest.raises(ConfigError) as e:
        GLM5Config.from_dict(raw)
    assert "num_experts_per_tok" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        GLM5Config.from_dict(tiny().to_dict() | {"model_type": "llama"})
    assert "model_type" in _one_line(e)


def _rewrite(ckpt, edit):
    state = load_file(ckpt / "model.safetensors")
    edit(state)
    save_file(state, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_checkpoint_missing_a_tensor(ckpt):
    _rewrite(ckpt, lambda s: s.pop("model.layers.2.mlp.experts.5.down_proj.weight"))
    with pytest.raises(CheckpointError) as e:
        GLM5ForCausalLM.from_pretrained(ckpt)
    assert "missing 1 tensor(s): model.layers.2.mlp.experts.5.down_proj.weight" in _one_line(e)


def test_checkpoint_with_an_unexpected_tensor(ckpt):
    _rewrite(ckpt, lambda s: s.update({"model.layers.9.foo.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError) as e:
        GLM5ForCausalLM.from_pretrained(ckpt)
    assert "unexpected tensor(s): model.layers.9.foo.weight" in _one_line(e)


def test_checkpoint_with_a_shape_mismatch(ckpt):
    _rewrite(ckpt, lambda s: s.update({"model.layers.0.self_attn.kv_b_proj.weight": torch.zeros(3, 32)}))
    with pytest.raises(CheckpointError) as e:
        GLM5ForCausalLM.from_pretrained(ckpt)
    assert "model.layers.0.self_attn.kv_b_proj.weight is [3, 32], expected [128, 32]" in _one_line(e)


def test_missing_directory_and_missing_weights(tmp_path):
    with pytest.raises(CheckpointError) as e:
        GLM5ForCausalLM.from_pretrained(tmp_path / "nope")
    assert "does not exist" in _one_line(e)
    tiny().save(tmp_path)
    with pytest.raises(CheckpointError) as e:
        GLM5ForCausalLM.from_pretrained(tmp_path)
    assert "no model.safetensors" in _one_line(e)


def test_token_id_beyond_the_vocabulary():
    model = GLM5ForCausalLM.from_config(tiny(), seed=0)
    with pytest.raises(ValueError) as e:
        model(torch.tensor([[1, 8192, 3]]))
    assert "token id 8192 is outside the vocabulary (vocab_size 8192)" == _one_line(e)
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1]]))
