"""`glm5 model init` / `info` through Typer's CliRunner, on real checkpoint directories."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from glm5cli.app import app
from model import GLM5ForCausalLM

runner = CliRunner()


def test_init_writes_a_loadable_checkpoint_and_info_reads_it(tmp_path):
    out = tmp_path / "tiny"
    r = runner.invoke(app, ["model", "init", "--preset", "tiny", "--out", str(out), "--seed", "5"])
    assert r.exit_code == 0, r.output
    assert {"config.json", "generation_config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["temperature"] == 1.0 and gen["top_p"] == 0.95 and gen["pad_token_id"] == 8128
    model = GLM5ForCausalLM.from_pretrained(out)
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 8192)
    # same seed, same weights
    again = tmp_path / "again"
    runner.invoke(app, ["model", "init", "--preset", "tiny", "--out", str(again), "--seed", "5"])
    assert (out / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()

    r = runner.invoke(app, ["model", "info", str(out), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    n = sum(t.numel() for t in model.state_dict().values())
    assert d["parameters"]["total"] + d["parameters"]["mtp"] == n
    assert d["layers"] == {"decoder": 3, "mtp": 1, "dense": 1, "moe": 2, "indexer_full": 3, "indexer_shared": 0}
    r = runner.invoke(app, ["model", "info", str(out)])
    assert r.exit_code == 0 and "MTP" in r.output and "tokenizer" in r.output


def test_info_for_the_glm5_preset_shows_744b_total_and_40b_active():
    r = runner.invoke(app, ["model", "info", "--preset", "glm5"])
    assert r.exit_code == 0, r.output
    assert "744B total" in r.output and "40.8B active" in r.output
    d = json.loads(runner.invoke(app, ["model", "info", "--preset", "glm5", "--json"]).output)
    assert d["layers"]["decoder"] == 78 and d["layers"]["mtp"] == 1
    kv = d["memory_bytes"]["kv_cache_per_1k_tokens_bf16"]
    assert kv == 2 * 1024 * 78 * (512 + 64 + 128)


def test_bad_invocations_fail_with_a_named_problem(tmp_path):
    r = runner.invoke(app, ["model", "init", "--preset", "glm5", "--out", str(tmp_path / "x")])
    assert r.exit_code == 1 and "too big" in r.output
    r = runner.invoke(app, ["model", "init", "--preset", "huge", "--out", str(tmp_path / "x")])
    assert r.exit_code == 1 and "unknown preset 'huge'" in r.output
    r = runner.invoke(app, ["model", "info", str(tmp_path)])
    assert r.exit_code == 1 and "no config.json" in r.output
    r = runner.invoke(app, ["model", "info"])
    assert r.exit_code == 2


def test_convert_rewrites_dtype_and_keeps_the_tokenizer_and_refuses_int4(tmp_path):
    src, f32, bf16, q = tmp_path / "src", tmp_path / "f32", tmp_path / "bf16", tmp_path / "q"
    assert runner.invoke(app, ["model", "init", "--preset", "tiny", "--out", str(src)]).exit_code == 0
    r = runner.invoke(app, ["model", "convert", str(src), "--out", str(bf16)])
    assert r.exit_code == 0, r.output
    assert (bf16 / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert json.loads((bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    ids = torch.tensor([[5, 6, 7, 8]])
    ref = GLM5ForCausalLM.from_pretrained(src)(ids)
    assert runner.invoke(app, ["model", "convert", str(bf16), "--out", str(f32), "--dtype", "float32"]).exit_code == 0
    back = GLM5ForCausalLM.from_pretrained(f32)(ids)
    assert (back - ref).abs().max() < 0.05 * ref.abs().max()  # bf16 rounding of every weight, nothing more
    assert runner.invoke(app, ["model", "quantize", str(src), "--out", str(q), "--group-size", "32"]).exit_code == 0
    r = runner.invoke(app, ["model", "info", str(q), "--json"])
    assert json.loads(r.output)["quantization"] == "int4 g32 symmetric (pack-quantized)"
    r = runner.invoke(app, ["model", "convert", str(q), "--out", str(tmp_path / "no")])
    assert r.exit_code == 1 and "INT4" in r.output


def test_init_set_changes_preset_fields_and_names_a_bad_one(tmp_path):
    out = tmp_path / "mid"
    r = runner.invoke(app, ["model", "init", "--preset", "tiny", "--out", str(out), "--set", "hidden_size=96",
                            "--set", "index_topk=8"])  # fmt: skip
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_size"] == 96 and cfg["index_topk"] == 8
    assert GLM5ForCausalLM.from_pretrained(out)(torch.tensor([[1, 2, 3]])).shape == (1, 3, 8192)
    r = runner.invoke(app, ["model", "init", "--out", str(tmp_path / "x"), "--set", "hiden_size=96"])
    assert r.exit_code != 0 and "hiden_size" in r.output and not (tmp_path / "x").exists()
    r = runner.invoke(app, ["model", "init", "--out", str(tmp_path / "y"), "--set", "num_experts_per_tok=99"])
    assert r.exit_code != 0 and "num_experts_per_tok" in r.output
