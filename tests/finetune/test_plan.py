"""`finetune/plan.py`: the LoRA count is the adapter's, the activation model is what autograd keeps on `small`
(measured), and `glm5 finetune plan` refuses what cannot fit, naming what would."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from finetune.lora import LoraSettings, add_lora
from finetune.plan import Layout, PlanError, activation_bytes, check, lora_parameters, plan
from glm5cli.app import app
from model import GLM5ForCausalLM, preset

runner = CliRunner(env={"COLUMNS": "200"})


def test_lora_parameters_equal_the_adapters_that_add_lora_makes():
    cfg = preset("tiny")
    net = add_lora(GLM5ForCausalLM.from_config(cfg, seed=0), LoraSettings(rank=4))
    counted = sum(p.numel() for n, p in net.named_parameters() if "lora_" in n)
    assert lora_parameters(cfg, 4) == counted


def _saved_activation_bytes(net, T: int) -> int:
    """Bytes autograd keeps for the backward of one SFT forward (parameters excluded: they are the weights row)."""
    from finetune.sft import sft_loss

    own = {t.untyped_storage().data_ptr() for t in list(net.parameters()) + list(net.buffers())}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            seen[s.data_ptr()] = s.nbytes()
        return t

    ids = torch.randint(0, 8000, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sft_loss(net, ids, torch.ones(1, T, dtype=torch.bool))
    return sum(seen.values())


@pytest.mark.parametrize("T", [128, 512])
def test_the_activation_model_is_within_a_third_of_what_autograd_keeps_on_small(T):
    cfg = preset("small").replace(num_hidden_layers=3, num_nextn_predict_layers=0)
    net = add_lora(GLM5ForCausalLM.from_config(cfg, seed=0), LoraSettings(rank=16))
    measured = _saved_activation_bytes(net, T)
    model = sum(activation_bytes(cfg, T, 1, act_bytes=4, checkpointing=False).values())
    assert 0.67 < model / measured < 1.33, (model, measured)


def test_glm5_on_one_h200_node_int4_fits_and_fp8_is_refused_naming_two_nodes():
    glm5 = preset("glm5")
    assert plan(glm5, Layout(gpus=8, gpu_mem=141e9, base="int4", seq_len=4096)).fits
    with pytest.raises(PlanError, match=r"2 nodes of 8 GPUs \(--gpus 16\).*slime"):
        check(glm5, Layout(gpus=8, gpu_mem=141e9, base="fp8", seq_len=4096))
    long = plan(glm5, Layout(gpus=8, gpu_mem=141e9, base="int4", seq_len=32768))
    assert not long.fits and "--seq-len" in long.advice  # activations per GPU do not shrink with more GPUs
    offloaded = plan(glm5, Layout(base="int4", offload_optimizer=True))
    assert offloaded.rows["optimizer"] == 0 and offloaded.host["optimizer (offloaded)"] > 0


def test_plan_command_prints_the_table_and_exits_3_when_it_does_not_fit():
    ok = runner.invoke(app, ["finetune", "plan", "--preset", "glm5", "--base", "int4", "--gpu-mem", "141GB"])
    assert ok.exit_code == 0, ok.output
    assert "weights" in ok.output and "activations: one layer" in ok.output and "fits" in ok.output
    bad = runner.invoke(app, ["finetune", "plan", "--preset", "glm5", "--gpu-mem", "80GB", "--json"])
    assert bad.exit_code == 3
    out = json.loads(bad.stdout)
    assert not out["fits"] and "nodes" in out["advice"] and out["per_gpu"]["weights"] > 80e9 / 1.1 - 1
    usage = runner.invoke(app, ["finetune", "plan", "--preset", "glm5", "--gpu-mem", "lots"])
    assert usage.exit_code == 2 and "memory size" in usage.output


def test_preflight_stops_a_training_command_before_it_loads(tmp_path):
    from typer import Exit

    from glm5cli.plan_cmd import preflight

    preset("glm5").replace(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}).save(tmp_path)
    with pytest.raises(Exit) as e:
        preflight(tmp_path, "sft", 4096, devices=(8, 141e9))
    assert e.value.exit_code == 3
    preflight(tmp_path, "sft", 4096, devices=(16, 141e9))  # two nodes: fits, returns
