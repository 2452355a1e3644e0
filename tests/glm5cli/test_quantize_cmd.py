"""`glm5 model quantize` (the command body in glm5cli/quantize_cmd.py), run through Typer's CliRunner."""

from __future__ import annotations

import json

import torch
import typer
from safetensors.torch import save_file
from typer.testing import CliRunner

from glm5cli.quantize_cmd import quantize
from tests.model.test_quant_int4 import TinyLM

app = typer.Typer()
app.command("quantize")(quantize)
app.command("noop")(lambda: None)  # two commands, so "quantize" is addressed by name as under `glm5 model`


def _src(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    save_file(TinyLM().state_dict(), str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"architectures": ["TinyLM"]}))
    return src


def test_quantize_writes_a_w4a16_checkpoint(tmp_path):
    src = _src(tmp_path)
    r = CliRunner().invoke(
        app, ["quantize", str(src), "--out", str(tmp_path / "q"), "--bits", "4", "--group-size", "32", "--json"]
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["quantized_modules"] == 34 and summary["group_size"] == 32 and summary["symmetric"] is True
    block = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert block["format"] == "pack-quantized" and block["config_groups"]["group_0"]["weights"]["group_size"] == 32
    from model.compressed_tensors import read_tensors

    assert read_tensors(tmp_path / "q")["model.layers.0.self_attn.q_a_proj.weight_packed"].dtype == torch.int32


def test_quantize_keep_overrides_the_default_split(tmp_path):
    src = _src(tmp_path)
    r = CliRunner().invoke(
        app,
        ["quantize", str(src), "-o", str(tmp_path / "q"), "--group-size", "32", "--asymmetric", "--keep", "experts"],
    )
    assert r.exit_code == 0, r.output
    assert "in int4" in r.output
    block = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert "model.layers.0.mlp.experts.0.up_proj" in block["ignore"] and "lm_head" not in block["ignore"]
    assert block["config_groups"]["group_0"]["weights"]["symmetric"] is False
    assert block["config_groups"]["group_0"]["weights"]["observer"] == "mse"
    r = CliRunner().invoke(
        app, ["quantize", str(src), "-o", str(tmp_path / "m"), "--group-size", "32", "--observer", "minmax"]
    )
    assert r.exit_code == 0, r.output
    block = json.loads((tmp_path / "m" / "config.json").read_text())["quantization_config"]
    assert block["config_groups"]["group_0"]["weights"]["observer"] == "minmax"


def test_quantize_rejects_bad_arguments(tmp_path):
    src = _src(tmp_path)
    runner = CliRunner()
    r = runner.invoke(app, ["quantize", str(src), "--out", str(tmp_path / "q"), "--bits", "8"])
    assert r.exit_code == 2 and "--bits 8 is not supported" in r.output
    r = runner.invoke(app, ["quantize", str(src), "--out", str(tmp_path / "q"), "--group-size", "100"])
    assert r.exit_code == 2 and "choose one of" in r.output
    r = runner.invoke(app, ["quantize", str(tmp_path), "--out", str(tmp_path / "q")])
    assert r.exit_code == 1 and "no config.json" in r.output
    r = runner.invoke(app, ["quantize", str(src), "--out", str(src)])
    assert r.exit_code == 1 and "not empty" in r.output
    # hidden 64 cannot hold a 128-column group: those linears are kept, not silently broken
    r = runner.invoke(app, ["quantize", str(src), "--out", str(tmp_path / "q128"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["quantized_modules"] == 0
