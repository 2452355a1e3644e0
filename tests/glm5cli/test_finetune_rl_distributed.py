"""`torchrun --nproc-per-node 2 -m glm5cli finetune rl --qlora`: agentic RL with the policy LoRA over an FP8 base
that no process holds whole, sharded over two gloo ranks, sampling through the run's `glm5 serve` child: the same
run as one process (each step's rewards, calls, trained tokens, gradient norm and mismatch; the adapter), and a
run stopped by its scheduler resumes from its state.pt (the trainer's state gathered to rank 0 and broadcast
back)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.lora import LoraSettings, add_lora
from finetune.rl.config import RLConfig
from finetune.rl.trainer import Trainer
from glm5cli.app import app
from model import GLM5ForCausalLM
from model.config import preset
from tests.finetune.torchrun import ROOT
from tests.finetune.torchrun import torchrun as run_torchrun
from tests.glm5cli.test_finetune_distill_distributed import fp8_student  # noqa: F401  (a fixture)
from tests.glm5cli.test_finetune_sft import ckpt  # noqa: F401  (a fixture)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})
OPTS = ["--env", "scripted", "--group-size", "4", "--groups-per-step", "2", "--max-new-tokens", "5", "--max-turns",
        "2", "--max-model-len", "256", "--lr", "5e-3", "--rank", "4", "--sync", "--concurrency", "4", "--save-every",
        "0", "--rollout-engine", "process", "--engine-threads", "1", "--json"]  # fmt: skip
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="300")
KEYS = ("reward_mean", "solved_rate", "model_calls", "sessions", "train_tokens", "groups_dropped", "version")


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "rl_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_ranks_train_the_sharded_policy_as_one_process(fp8_student, tmp_path):  # noqa: F811
    one, two = tmp_path / "one", tmp_path / "two"
    r = runner.invoke(app, ["finetune", "rl", str(fp8_student), "--qlora", "--out", str(one), "--steps", "3", *OPTS])
    assert r.exit_code == 0, r.output
    p = run_torchrun(2, "-m", "glm5cli", "finetune", "rl", str(fp8_student), "--qlora", "--out", str(two), "--steps",
                     "3", *OPTS, env=ENV)  # fmt: skip
    summary = json.loads(p.stdout[p.stdout.index("{") :])  # rank 0's, once
    assert p.stdout.count('"out"') == 1 and summary["steps"] == 3
    want, got = _rows(one), _rows(two)
    assert sum(r["train_tokens"] for r in want) > 0  # some step had signal: the comparison trains something
    for a, b in zip(want, got, strict=True):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, a["step"]
        assert b["pg_grad_norm"] == pytest.approx(a["pg_grad_norm"], rel=1e-4, abs=1e-6)
        assert b["mismatch"] == pytest.approx(a["mismatch"], rel=1e-3, abs=1e-6)
    x, y = (
        load_file(one / "adapter" / "adapter_model.safetensors"),
        load_file(two / "adapter" / "adapter_model.safetensors"),
    )
    assert x.keys() == y.keys()
    # summed over the adapter (measured 2e-7): AdamW's m / sqrt(v) makes a step of lr out of a gradient element
    # at rounding level, so a few elements differ by up to 2 lr between any two summation orders
    diff = sum(float((x[k] - y[k]).abs().sum()) for k in x) / sum(float(x[k].abs().sum()) for k in x)
    assert any(float(t.abs().max()) > 0 for k, t in x.items() if "lora_B" in k) and diff < 1e-5
    assert json.loads((two / "adapter" / "adapter_base.json").read_text())["trained_over"] == "fp8"


@pytest.mark.slow
def test_a_stopped_two_rank_run_resumes_from_its_state(fp8_student, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone", "-m", "glm5cli",
           "finetune", "rl", str(fp8_student), "--qlora", "--out", str(out), "--steps", "3", *OPTS]  # fmt: skip
    p = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    log = tmp_path / ".out.partial" / "rl_log.jsonl"
    deadline = time.monotonic() + 300
    while p.poll() is None and time.monotonic() < deadline and not (log.is_file() and log.read_text().count("\n")):
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)  # as a scheduler stops a job: torchrun stops its ranks
    p.communicate(timeout=120)
    assert not out.exists() and log.read_text().count("\n") >= 1, "the run ended before it could be stopped"
    done = log.read_text().count("\n")
    r = run_torchrun(2, *cmd[5:], env=ENV)
    assert f"from step {done} of 3" in r.stderr
    rows = _rows(out)
    assert [row["version"] for row in rows] == [1, 2, 3]
    assert all(set(row["staleness_hist"]) == {"0"} for row in rows)  # the fresh child served the restored version


def test_a_sharded_runs_state_is_refused_by_one_process_with_what_to_do():
    model = add_lora(GLM5ForCausalLM.from_config(preset("tiny"), seed=0), LoraSettings(rank=2), seed=0)
    trainer = Trainer(model, RLConfig(steps=1))
    with pytest.raises(ValueError, match="written by a torchrun run"):
        trainer.restore({"version": 1, "params": {}, "optimizer": {}, "optimizer_by_name": {}})


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--quant", "int4"], "instead of --quant int4"),
        (["--rollout-engine", "thread"], "samples through a rollout server"),
    ],
)
def test_qlora_usage_errors(fp8_student, tmp_path, extra, msg):  # noqa: F811
    args = ["finetune", "rl", str(fp8_student), "--qlora", "--out", str(tmp_path / "o"), "--env", "scripted", *extra]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and msg in r.output, r.output


def test_qlora_is_refused_for_the_completion_env(fp8_student, tmp_path):  # noqa: F811
    r = runner.invoke(app, ["finetune", "rl", str(fp8_student), "--qlora", "--out", str(tmp_path / "o"),
                            "--env", "completion", "--tasks", str(tmp_path / "t.jsonl")])  # fmt: skip
    assert r.exit_code == 2 and "--qlora is for agentic RL" in r.output
