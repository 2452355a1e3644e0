"""`torchrun --nproc-per-node 2 -m glm5cli finetune sft`: real torchrun processes (gloo, CPU) train as one process
does on the same global batch, write an adapter that `glm5 serve --lora`'s code loads, and their checkpoints
resume at the other world size (2 -> 1 after a kill, 1 -> 2 after a kill).

The loss curves are compared within 5e-3 of each value, not to fp32's 1e-7: AdamW divides each gradient element
by its own running magnitude, so an element that is ~0 in both runs can step either way from rounding, and the
curves part by ~1e-4..1e-3 within six steps at this learning rate. A single process does the same against itself
when only the batch's summation order changes (--micro-batch 1). The gradient itself is checked to 1e-4 in
tests/finetune/test_distributed.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import finetune.sft
from glm5cli.app import app
from model import GLM5ForCausalLM
from tests.finetune.torchrun import torchrun as run_torchrun
from tests.glm5cli.test_finetune_sft import _sessions, ckpt, dies_after_first_save  # noqa: F401  (a fixture)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner(env={"COLUMNS": "300"})
OPTS = ["--steps", "6", "--lr", "3e-3", "--rank", "4", "--batch-size", "3", "--save-every", "2"]


def torchrun(args: list[str]) -> subprocess.Popen:
    """`torchrun --nproc-per-node 2 -m glm5cli ARGS` in its own process group (--standalone: the rendezvous store
    binds a free port itself, so there is no race for one)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="300")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone"]
    return subprocess.Popen(
        [*cmd, "-m", "glm5cli", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finished(p: subprocess.Popen) -> tuple[str, str]:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-4000:]
    return out, err


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "train_log.jsonl").read_text().splitlines()]


def assert_curves_agree(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want) and want[-1] < want[0] / 2, (got, want)  # the run learned something
    assert all(abs(a - b) <= 5e-3 * abs(b) for a, b in zip(got, want, strict=True)), (got, want)


def served_logits(base_ckpt: Path, adapter: Path) -> torch.Tensor:
    """What `glm5 serve --lora ADAPTER` runs: the base with the adapter loaded (finetune/lora.py) and merged."""
    from finetune.lora import AdapterBaseMismatch, load_adapter, merge_lora

    with warnings.catch_warnings():
        warnings.simplefilter("error", AdapterBaseMismatch)  # the recorded fingerprint is the base's
        model = merge_lora(load_adapter(GLM5ForCausalLM.from_pretrained(base_ckpt), adapter)).eval()
    with torch.no_grad():
        return model(torch.tensor([list(range(100, 140))]))


def assert_close_to_scale(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-2) -> None:
    assert float((a - b).abs().max()) <= rel * float(b.abs().max())


@pytest.fixture(scope="module")
def whole(ckpt, tmp_path_factory):  # noqa: F811
    """The single-process LoRA run the distributed ones are compared with."""
    tmp = tmp_path_factory.mktemp("whole")
    out = tmp / "out"
    args = ["finetune", "sft", str(ckpt), "--out", str(out), "--trajectories", str(_sessions(tmp / "s")), *OPTS]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return out


def test_two_processes_train_as_one_and_write_the_adapter_serve_loads(ckpt, whole, tmp_path):  # noqa: F811
    out = tmp_path / "two"
    sessions = _sessions(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="300")
    args = ["finetune", "sft", str(ckpt), "--out", str(out), "--trajectories", str(sessions), *OPTS, "--json"]
    r = run_torchrun(2, "-m", "glm5cli", *args, env=env)  # started again if gloo aborts (tests/finetune/torchrun.py)
    stdout, stderr = r.stdout, r.stderr
    assert_curves_agree(losses(out), losses(whole))
    summary = json.loads(stdout[stdout.index("{") :])  # one summary: rank 0's
    assert summary["steps"] == 6 and stdout.count('"out"') == 1
    assert stderr.count("data: 3 sequences") == 1  # only rank 0 reports
    assert sorted(x.name for x in out.iterdir()) == ["adapter", "train_log.jsonl"]
    assert_close_to_scale(served_logits(ckpt, out / "adapter"), served_logits(ckpt, whole / "adapter"))


def killed_after_a_checkpoint_then_resumed(ckpt, whole, tmp_path, *extra: str) -> None:  # noqa: F811
    """A two-process run of `finetune sft ... *extra` stopped after its first DCP checkpoint, then the same command on
    one process: it resumes from that checkpoint and ends where the single-process LoRA run does."""
    out = tmp_path / "out"
    args = ["finetune", "sft", str(ckpt), "--out", str(out), "--trajectories", str(_sessions(tmp_path / "s")), *OPTS,
            *extra]  # fmt: skip
    work = out.with_name(f".{out.name}.partial")
    p = torchrun(args)
    deadline = time.monotonic() + 600
    while not list(work.glob("dcp-*/meta.json")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    # Interrupted as a scheduler stops a job: SIGTERM to torchrun, which stops its ranks (each in a session of
    # its own) and exits.
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    assert not out.exists() and list(work.glob("dcp-*/meta.json")), "the run ended before it could be killed"
    r = runner.invoke(app, args)  # one process, this run's command
    assert r.exit_code == 0, r.output
    assert "resuming" in r.output and " of 6" in r.output and not list(out.glob("dcp-*"))
    assert_curves_agree(losses(out), losses(whole))
    assert_close_to_scale(served_logits(ckpt, out / "adapter"), served_logits(ckpt, whole / "adapter"))


def test_a_two_process_run_killed_after_a_checkpoint_resumes_in_one_process(ckpt, whole, tmp_path):  # noqa: F811
    killed_after_a_checkpoint_then_resumed(ckpt, whole, tmp_path)


def test_a_one_process_full_run_killed_after_a_checkpoint_resumes_on_two(ckpt, tmp_path, monkeypatch):  # noqa: F811
    args = ["--trajectories", str(_sessions(tmp_path / "s")), *OPTS, "--full"]
    whole_full = tmp_path / "whole"
    r = runner.invoke(app, ["finetune", "sft", str(ckpt), "--out", str(whole_full), *args])
    assert r.exit_code == 0, r.output
    out, saves = tmp_path / "out", []
    monkeypatch.setattr(finetune.sft, "train", dies_after_first_save(finetune.sft.train, saves))
    r = runner.invoke(app, ["finetune", "sft", str(ckpt), "--out", str(out), *args])
    assert r.exit_code != 0 and saves == [2] and not out.exists()
    _, stderr = finished(torchrun(["finetune", "sft", str(ckpt), "--out", str(out), *args]))
    assert stderr.count("from step 2 of 6") == 1, stderr[-2000:]
    assert_curves_agree(losses(out), losses(whole_full))
    with torch.no_grad():  # the checkpoint rank 0 gathered is the fine-tuned model, as one process wrote it
        ids = torch.tensor([list(range(100, 140))])
        got = GLM5ForCausalLM.from_pretrained(out).eval()(ids)
        want = GLM5ForCausalLM.from_pretrained(whole_full).eval()(ids)
        base = GLM5ForCausalLM.from_pretrained(ckpt).eval()(ids)
    assert_close_to_scale(got, want)
    assert float((want - base).abs().max()) > 10 * float((got - want).abs().max())  # training moved it much more


def test_a_two_process_qlora_run_killed_after_a_checkpoint_resumes(ckpt, whole, tmp_path):  # noqa: F811
    """--qlora (the base frozen as stored, each rank reading its own shards) keeps the same checkpoints."""
    killed_after_a_checkpoint_then_resumed(ckpt, whole, tmp_path, "--qlora")
