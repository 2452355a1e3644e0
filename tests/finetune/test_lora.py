"""LoRA adapters: they record their base (path and weights fingerprint) and warn when loaded onto another."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from finetune.lora import AdapterBaseMismatch, LoraSettings, add_lora, load_adapter, save_adapter, weights_fingerprint
from model import GLM5ForCausalLM
from model.config import preset


def _model(seed: int) -> GLM5ForCausalLM:
    return GLM5ForCausalLM.from_config(preset("tiny"), seed=seed)


def test_an_adapter_records_its_base_and_warns_on_another(tmp_path):
    base = _model(0)
    fp = weights_fingerprint(base)
    assert fp == weights_fingerprint(_model(0)) and fp != weights_fingerprint(_model(1))
    net = add_lora(base, LoraSettings(rank=2))
    assert weights_fingerprint(net) == fp  # LoRA wrapping changes nothing the fingerprint reads
    save_adapter(net, tmp_path / "a", base="/ckpt/base")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "/ckpt/base"
    assert json.loads((tmp_path / "a" / "adapter_base.json").read_text())["weights_fingerprint"] == fp
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_adapter(_model(0), tmp_path / "a")  # the same weights: no warning
    with pytest.warns(AdapterBaseMismatch, match="/ckpt/base"):
        load_adapter(_model(1), tmp_path / "a")
    # One changed value anywhere the sample reads is another base.
    other = _model(0)
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1.0
    assert weights_fingerprint(other) != fp
