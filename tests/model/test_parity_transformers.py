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

from model import GLM5Config, GLM5ForCausalLM, kernels
from tests.model.conftest import close, randomize

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
                assert close(got, ref, 1e-5), (case, T, impl)


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
        assert close(ours(ids), hf(ids).logits, 1e-5)


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
        assert close(got, ref, 1e-5), (case, T, n)


ODD = BASE | dict(
    vocab_size=301,
    hidden_size=35,
    intermediate_size=37,
    moe_intermediate_size=13,
    num_hidden_layers=3,
    q_lora_rank=29,
    kv_lora_rank=19,
    qk_nope_head_dim=7,
    v_head_dim=9,
    n_routed_experts=5,
    num_experts_per_tok=3,
    index_topk=7,
    index_n_heads=5,
    index_head_dim=11,
    num_nextn_predict_layers=1,  # as GLM-5's config says; transformers' model has no MTP layer to save
)


def test_a_transformers_checkpoint_without_its_mtp_layer_loads_serves_and_saves_back(tmp_path, caplog):
    """transformers' save_pretrained writes a config with num_nextn_predict_layers 1 and no model.layers.3.*: it
    loads without the MTP layer (one warning), MTP speculation refuses it by name, and our save loads back in
    transformers (and in ours, without the warning) with the same logits."""
    from typer.testing import CliRunner

    from glm5cli.app import app
    from model.checkpoint import checkpoint_has_mtp
    from serve.engine.llm import LLM

    # experts_implementation eager: torch's CPU grouped GEMM needs rows of a multiple of 16 bytes (not 35 floats)
    hf_cfg = transformers.GlmMoeDsaConfig(**ODD, experts_implementation="eager")
    hf = randomize(transformers.GlmMoeDsaForCausalLM(hf_cfg).eval(), seed=3)
    hf.save_pretrained(tmp_path / "hf")
    assert not checkpoint_has_mtp(tmp_path / "hf")
    with caplog.at_level("WARNING", logger="model.checkpoint"):
        ours = GLM5ForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "no MTP layer" in caplog.text and ours.config.num_nextn_predict_layers == 0
    assert len(ours.model.layers) == 3
    ids = torch.randint(0, 301, (2, 17))  # longer than index_topk: sparse selection
    with torch.no_grad():
        ref = hf(ids).logits
        assert close(ours(ids), ref, 1e-5)
        with kernels.use("torch"):  # the plain ops: torch's grouped GEMM, which takes no odd-size rows
            assert close(ours(ids), ref, 1e-5)
    with pytest.raises(ValueError, match="has none .* serve it without speculative decoding"):
        LLM(ours, speculative="mtp")
    runner = CliRunner(env={"COLUMNS": "300"})
    r = runner.invoke(app, ["serve", str(tmp_path / "hf"), "--speculative", "mtp"])
    assert r.exit_code == 2 and "no MTP layer" in r.output and "--speculative off" in r.output
    r = runner.invoke(app, ["serve", str(tmp_path / "hf"), "--engine", "sglang", "--dry-run"])
    assert r.exit_code == 0 and "--speculative-algorithm" not in r.output, r.output  # the default turns off

    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["num_nextn_predict_layers"] == 0
    back = transformers.GlmMoeDsaForCausalLM.from_pretrained(
        tmp_path / "ours", dtype=torch.float32, experts_implementation="eager"
    ).eval()
    caplog.clear()
    again = GLM5ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32)
    assert "no MTP layer" not in caplog.text
    with torch.no_grad():
        assert torch.equal(back(ids).logits, ref)  # the same weights, bit for bit, through both saves
        assert torch.equal(again(ids), ours(ids))


def test_some_but_not_all_mtp_tensors_is_still_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    from model.checkpoint import CheckpointError

    cfg = GLM5Config.from_dict(ODD)
    randomize(GLM5ForCausalLM(cfg), seed=4).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.3.eh_proj.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="missing 1 tensor.*model.layers.3.eh_proj.weight"):
        GLM5ForCausalLM.from_pretrained(tmp_path)
