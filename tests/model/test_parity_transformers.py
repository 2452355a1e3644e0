"""Our GLM5ForCausalLM against transformers' GlmMoeDsaForCausalLM, both ways, through real checkpoints.

transformers builds q_a_layernorm / kv_a_layernorm with eps 1e-6 while we use rms_norm_eps (as vLLM, reference
§4); the configs here set rms_norm_eps=1e-6 so both agree. transformers does not know the MTP layer (it ignores
`model.layers.78.*` only), so these configs have num_nextn_predict_layers=0; the MTP layer is tested in
test_mtp.py against a transcription of its formula.
"""

from __future__ import annotations

import json

import pytest
import torch

from model import GLM5Config, GLM5ForCausalLM
from tests.model.conftest import randomize

transformers = pytest.importorskip("transformers")

BASE = dict(
    vocab_size=300,
    hidden_size=48,
    intermediate_size=80,
    moe_intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=3,
    num_key_value_heads=3,
    q_lora_rank=40,
    kv_lora_rank=24,
    qk_nope_head_dim=12,
    qk_rope_head_dim=6,
    v_head_dim=10,
    n_routed_experts=6,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    index_topk=8,
    index_n_heads=16,
    index_head_dim=10,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    num_nextn_predict_layers=0,
    pad_token_id=None,
    eos_token_id=1,
)

CASES = {
    "moe_full": {},
    "shared_indexer_groups": dict(index_topk_pattern="FSFS", n_group=2, topk_group=1, n_routed_experts=8),
    "dense_only_odd": dict(num_hidden_layers=2, first_k_dense_replace=2, index_topk=5, index_topk_pattern="FS"),
}


def _hf_model(changes: dict):
    cfg = transformers.GlmMoeDsaConfig(**(BASE | changes))
    model = transformers.GlmMoeDsaForCausalLM(cfg).eval()
    return randomize(model, seed=1)


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("case", list(CASES))
def test_transformers_checkpoint_loads_with_same_logits(case, tmp_path):
    hf = _hf_model(CASES[case])
    hf.save_pretrained(tmp_path, max_shard_size="200KB")  # shards + model.safetensors.index.json
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = GLM5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert ours.config.layer_indexer_types == tuple(hf.config.indexer_types)
    for T in (5, 23):  # shorter and longer than index_topk: dense and sparse selection
        ids = torch.randint(0, 300, (2, T))
        ref = _hf_logits(hf, ids)
        with torch.no_grad():
            for impl in ("auto", "expanded", "absorbed"):
                got = ours(ids, attn_impl=impl)
                assert (got - ref).abs().max().item() < 1e-4, (case, T, impl)


def test_our_checkpoint_loads_in_transformers_with_same_logits(tmp_path):
    # With our MTP layer on disk as model.layers.4.*: transformers reports it unexpected and ignores it.
    cfg = GLM5Config.from_dict(BASE | CASES["shared_indexer_groups"] | {"num_nextn_predict_layers": 1})
    ours = randomize(GLM5ForCausalLM(cfg), seed=2).eval()
    ours.save_pretrained(tmp_path)
    on_disk = json.loads((tmp_path / "config.json").read_text())
    assert on_disk["model_type"] == "glm_moe_dsa" and on_disk["indexer_types"] == ["full", "shared", "full", "shared"]
    hf = transformers.GlmMoeDsaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert hf.config.indexer_types == ["full", "shared", "full", "shared"]
    ids = torch.randint(0, 300, (1, 29))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("case", ["moe_full", "shared_indexer_groups"])
def test_logits_to_keep_matches_transformers(case, tmp_path):
    """A prefill that keeps only the last positions' logits (transformers' `logits_to_keep`, what its generate()
    runs): ours runs the last layer for those positions only and still agrees with transformers."""
    hf = _hf_model(CASES[case])
    hf.save_pretrained(tmp_path)
    ours = GLM5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    for T, n in ((5, 1), (23, 1), (23, 4)):  # dense and sparse selection
        ids = torch.randint(0, 300, (2, T))
        with torch.no_grad():
            ref = hf(ids, use_cache=True, logits_to_keep=n).logits
            got = ours(ids, logits_to_keep=n)
        assert got.shape == ref.shape == (2, n, 300)
        assert (got - ref).abs().max().item() < 1e-4, (case, T, n)
