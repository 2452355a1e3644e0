"""Checkpoint I/O through real safetensors files: round trips, shards, FP8 dequantisation, dtypes, MTP."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import GLM5ForCausalLM
from model.fp8 import dequantize_fp8, quantize_fp8
from tests.model.conftest import randomize, tiny


@pytest.fixture
def model():
    return randomize(GLM5ForCausalLM(tiny())).eval()


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_round_trip_single_file_keeps_every_tensor_and_the_mtp_layer(model, tmp_path):
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "model.safetensors.index.json").exists()
    names = load_file(tmp_path / "model.safetensors").keys()
    assert "model.layers.3.eh_proj.weight" in names and "model.layers.2.mlp.experts.7.up_proj.weight" in names
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["temperature"] == 1.0 and gen["top_p"] == 0.95 and gen["eos_token_id"] == list(model.config.eos_ids)
    loaded = GLM5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    _same_weights(model, loaded)
    assert loaded.config.to_dict() == model.config.replace(dtype="float32").to_dict()
    ids = torch.randint(0, 8000, (1, 20))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))


def test_sharded_save_and_load(model, tmp_path):
    model.save_pretrained(tmp_path, max_shard_size="1MB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((tmp_path / s).is_file() for s in shards)
    assert set(index["weight_map"]) == set(model.state_dict())
    _same_weights(model, GLM5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32))


def test_bf16_load_keeps_the_router_in_fp32(model, tmp_path):
    model.save_pretrained(tmp_path)
    m = GLM5ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert m.get_parameter("model.layers.1.self_attn.q_a_proj.weight").dtype == torch.bfloat16
    assert m.get_parameter("model.layers.1.mlp.gate.weight").dtype == torch.float32
    assert m.get_buffer("model.layers.1.mlp.gate.e_score_correction_bias").dtype == torch.float32
    assert not any(p.is_meta for p in m.parameters())
    logits = m(torch.randint(0, 8000, (1, 9)))
    assert logits.shape == (1, 9, 8192) and torch.isfinite(logits).all()


def test_fp8_block_dequantisation_round_trip():
    w = torch.randn(300, 200)
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 2)
    assert (dequantize_fp8(q, s) - w).norm() < 0.05 * w.norm()  # e4m3: 3 mantissa bits
    # one scale per 128x128 block
    s2 = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    d = dequantize_fp8(torch.ones(300, 200).to(torch.float8_e4m3fn), s2)
    assert d[0, 0] == 1 and d[0, 199] == 2 and d[200, 0] == 3 and d[299, 199] == 6


def test_synthetic_fp8_checkpoint_loads_dequantised(model, tmp_path):
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    fp8, expect = {}, {}
    for name, t in state.items():
        keep_bf16 = any(k in name for k in ("embed_tokens", "lm_head", "norm", "mlp.gate.", "weights_proj", "eh_proj"))
        if t.dim() == 2 and not keep_bf16:
            q, s = quantize_fp8(t)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            expect[name] = dequantize_fp8(q, s)
        else:
            fp8[name] = t
    save_file(fp8, tmp_path / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    loaded = GLM5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert loaded.config.quantization_config is None  # dequantised: saving it again writes plain weights
    for name, t in expect.items():
        assert torch.equal(loaded.get_parameter(name), t), name
    ids = torch.randint(0, 8000, (1, 12))
    with torch.no_grad():
        ref, got = model(ids), loaded(ids)
    assert (got - ref).norm() < 0.15 * ref.norm()  # FP8 rounding of every linear, through 4 layers
