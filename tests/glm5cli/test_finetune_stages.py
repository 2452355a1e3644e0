"""`glm5 finetune dsa-warmup` and `glm5 finetune sft --qat int4`: help, bad input, --json, the run folder, the
checkpoints they write (what `glm5 serve` loads) and exact resume after interruptions at every stage."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from glm5cli.app import app
from model import GLM5ForCausalLM
from tests.glm5cli.test_finetune_sft import _sessions
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})


@pytest.fixture(scope="module")
def peaky(tiny_checkpoint, tmp_path_factory):  # noqa: F811
    """The tiny checkpoint with its attention logits scaled up (a random `tiny` attends almost uniformly, and
    so does its indexer: nothing to learn) and its lm_head too (see test_finetune_sft's `ckpt`)."""
    path = tmp_path_factory.mktemp("peaky-attn")
    shutil.copytree(tiny_checkpoint, path, dirs_exist_ok=True)
    model = GLM5ForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for layer in model.model.layers[: model.config.num_hidden_layers]:
            layer.self_attn.q_b_proj.weight.mul_(12.0)
            layer.self_attn.kv_b_proj.weight.mul_(12.0)
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(path)
    return path


def _json(r) -> dict:
    return json.loads(r.stdout[r.stdout.index("{") :])


def test_dsa_warmup_help_and_bad_input(peaky, tmp_path):
    r = runner.invoke(app, ["finetune", "dsa-warmup", "--help"])
    assert r.exit_code == 0 and "indexer" in r.output and "--sparse-steps" in r.output
    sessions = _sessions(tmp_path / "s", n=1)
    base = ["finetune", "dsa-warmup", str(peaky), "--out", str(tmp_path / "o")]
    r = runner.invoke(app, base)  # no --data
    assert r.exit_code == 2 and "--data" in r.output
    r = runner.invoke(app, [*base, "--data", str(sessions), "--warmup-steps", "0", "--sparse-steps", "0"])
    assert r.exit_code == 2 and "nothing to do" in r.output
    r = runner.invoke(app, [*base, "--data", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = runner.invoke(app, ["finetune", "dsa-warmup", str(tmp_path), "--out", str(tmp_path / "o"), "--data", "x"])
    assert r.exit_code == 1 and "not a checkpoint directory" in r.output
    assert not (tmp_path / "o").exists()


def test_dsa_warmup_trains_only_the_indexers_and_writes_a_run_folder(peaky, tmp_path):
    sessions = _sessions(tmp_path / "s", n=3)
    out = tmp_path / "warm"
    args = ["finetune", "dsa-warmup", str(peaky), "--out", str(out), "--data", str(sessions)]
    r = runner.invoke(app, [*args, "--warmup-steps", "8", "--lr", "1e-2", "--batch-size", "3", "--json"])
    assert r.exit_code == 0, r.output
    summary = _json(r)
    assert summary["kl_last"] < 0.9 * summary["kl_first"], summary
    assert summary["tokens_per_s"] > 0 and summary["sparse_steps"] == 0
    a, b = load_file(peaky / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert changed and all(".indexer." in k for k in changed), sorted(changed)[:4]
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == list(range(1, 9)) and all(x["stage"] == "warmup" for x in log)
    record = json.loads((out / "dsa_warmup.json").read_text())
    assert record["settings"]["warmup_steps"] == 8 and record["summary"]["kl_last"] == summary["kl_last"]
    assert (out / "tokenizer.json").is_file() and not (out / "state.pt").exists()
    GLM5ForCausalLM.from_pretrained(out)  # a checkpoint `glm5 serve` loads


def _dies(real, when):
    """`real` (the training loop) made to raise KeyboardInterrupt on its `when(call, saves)`-th save or start."""
    calls = {"n": 0}

    def loop(*a, save, **kw):
        calls["n"] += 1
        if when(calls["n"], None):
            raise KeyboardInterrupt

        def save_then_maybe_die(state):
            save(state)
            if when(calls["n"], state["step"]):
                raise KeyboardInterrupt

        return real(*a, save=save_then_maybe_die, **kw)

    return loop


@pytest.mark.slow
def test_dsa_warmup_resumes_exactly_at_every_stage(peaky, tmp_path, monkeypatch):
    """Killed in the warm-up, between the stages, and in the sparse stage: each rerun resumes, and the end is
    the checkpoint and log of a run never interrupted, bit for bit."""
    import finetune.dsa_warmup as dw

    sessions = _sessions(tmp_path / "s", n=2)
    opts = ["--data", str(sessions), "--warmup-steps", "4", "--sparse-steps", "4", "--save-every", "2"]
    opts += ["--lr", "1e-2", "--sparse-lr", "1e-3", "--batch-size", "2"]

    def run(out):
        return runner.invoke(app, ["finetune", "dsa-warmup", str(peaky), "--out", str(out), *opts])

    whole = tmp_path / "whole"
    assert run(whole).exit_code == 0
    out, real = tmp_path / "resumed", dw.train
    kills = [
        lambda call, step: call == 1 and step == 2,  # the warm-up, after its checkpoint at step 2
        lambda call, step: call == 2 and step is None,  # the sparse stage, as it starts
        lambda call, step: call == 1 and step == 2,  # the sparse stage, after its checkpoint at step 2
    ]
    said = ["warmup stage, step 2", "warmup_done stage", "sparse stage, step 2"]
    for i, when in enumerate(kills):
        monkeypatch.setattr(dw, "train", _dies(real, when))
        r = run(out)
        assert r.exit_code != 0 and not out.exists(), r.output
        if i:
            assert said[i - 1] in r.output, r.output
    monkeypatch.setattr(dw, "train", real)
    r = run(out)
    assert r.exit_code == 0 and said[-1] in r.output, r.output
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in (whole / "train_log.jsonl").open()]
    got = [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in (out / "train_log.jsonl").open()]
    assert got == strip and [x["stage"] for x in got] == ["warmup"] * 4 + ["sparse"] * 4
    base = load_file(peaky / "model.safetensors")
    assert any(not torch.equal(base[k], b[k]) for k in base if ".indexer." not in k)  # the sparse stage trained


@pytest.mark.parametrize("mode", [["--full"], ["--merge", "--rank", "4"]], ids=["full", "lora"])
def test_sft_qat_int4_writes_the_int4_checkpoint_it_trained_for(peaky, tmp_path, mode):
    from model.compressed_tensors import Int4Scheme, decompress, packed_modules, read_tensors
    from model.int4_numerics import dequantize_weight, fake_quantize_weight

    sessions = _sessions(tmp_path / "s", n=2)
    out = tmp_path / "qat"
    args = ["finetune", "sft", str(peaky), "--out", str(out), "--data", str(sessions), *mode, "--qat", "int4"]
    r = runner.invoke(app, [*args, "--qat-group-size", "32", "--steps", "3", "--lr", "1e-3", "--save-every", "1"])
    assert r.exit_code == 0, r.output
    assert f"glm5 serve {out / 'int4'}" in r.output.replace("\n", "")
    shutil.rmtree(out)
    r = runner.invoke(
        app, [*args, "--qat-group-size", "32", "--steps", "3", "--lr", "1e-3", "--save-every", "1", "--json"]
    )
    assert r.exit_code == 0, r.output
    summary = _json(r)
    # OUT/int4 is a checkpoint and nothing else (the run's data and optimizer state stay out of it).
    assert {p.name for p in (out / "int4").iterdir()} & {"run.json", "sequences.json", "state.pt"} == set()
    assert not (out / ".checkpoint").exists() and (out / "adapter").is_dir() == ("--merge" in mode)
    assert summary["int4_checkpoint"] == str(out / "int4")
    fp = GLM5ForCausalLM.from_pretrained(out)
    served = GLM5ForCausalLM.from_pretrained(out / "int4")  # compressed-tensors W4A16, as `glm5 serve` loads it
    assert type(served.model.layers[0].self_attn.q_a_proj).__name__ == "Int4Linear"
    from serve.engine import LLM, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert len(LLM(str(out / "int4"), num_kv_blocks=16).generate([[100, 101, 102]], greedy)[0].token_ids) == 4
    # The INT4 checkpoint holds exactly the weights the QAT forward multiplied by.
    state = read_tensors(out / "int4")
    assert summary["qat_linears"] == len(packed_modules(state.keys())) > 0  # QAT covered what INT4 quantizes
    name = "model.layers.1.mlp.experts.3.up_proj"
    local = {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")}
    w = fp.get_parameter(name + ".weight").detach()
    assert torch.equal(dequantize_weight(decompress(local, Int4Scheme(32, True))), fake_quantize_weight(w, 32))
    base = load_file(peaky / "model.safetensors")
    assert not torch.equal(base[name + ".weight"], w)  # it trained


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--qat", "int4"], "add --merge"),
        (["--full", "--qat", "int8"], "not supported"),
        (["--full", "--qat", "int4", "--qat-group-size", "48"], "not supported"),
    ],
)
def test_sft_qat_bad_input(tiny_checkpoint, tmp_path, extra, msg):  # noqa: F811
    sessions = _sessions(tmp_path / "s", n=1)
    r = runner.invoke(
        app, ["finetune", "sft", str(tiny_checkpoint), "--out", str(tmp_path / "o"), "--data", str(sessions), *extra]
    )
    assert r.exit_code == 2 and msg in r.output, r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_dsa_warmup_resumes_exactly_after_kill_9(peaky, tmp_path):
    """A real `kill -9` of the process in the sparse stage, once a checkpoint of it is on disk; the rerun ends
    with the checkpoint of a run never interrupted, bit for bit."""
    import os
    import signal
    import subprocess
    import sys
    import time

    sessions = _sessions(tmp_path / "s", n=2)

    def cmd(out):
        return [sys.executable, "-m", "glm5cli", "finetune", "dsa-warmup", str(peaky), "--out", str(out)] + [
            *["--data", str(sessions), "--warmup-steps", "2", "--sparse-steps", "10", "--save-every", "2"],
            *["--lr", "1e-2", "--sparse-lr", "1e-3", "--batch-size", "2"],
        ]

    env = os.environ | {"OMP_NUM_THREADS": "1"}
    whole = tmp_path / "whole"
    subprocess.run(cmd(whole), check=True, capture_output=True, env=env)
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    log = tmp_path / ".killed.partial" / "train_log.jsonl"
    while proc.poll() is None and not (log.is_file() and '"stage": "sparse", "step": 3' in log.read_text()):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # killed mid-run, in the sparse stage after its checkpoint at step 2
    r = subprocess.run(cmd(out), capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "resuming" in r.stderr and "sparse stage" in r.stderr, r.stderr
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [(x["stage"], x["step"]) for x in map(json.loads, (out / "train_log.jsonl").open())]
    assert steps == [("warmup", i) for i in range(1, 3)] + [("sparse", i) for i in range(1, 11)]
