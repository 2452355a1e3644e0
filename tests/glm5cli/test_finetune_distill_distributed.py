"""`torchrun --nproc-per-node 2 -m glm5cli finetune distill --qlora`: two gloo ranks distil a student whose base is
FP8 as GLM-5-FP8 ships it, never whole in either process, from a checkpoint teacher loaded the same way and from
`base`, and train as one process does: the same per-step reverse KL and the same adapter. The ranks hold
different numbers of prompts, prompt lengths and completion lengths (the lock-step sampling and scoring)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from finetune.distill_run import DistillJob, DistillRun
from finetune.errors import UsageError
from finetune.recipe import Quiet
from glm5cli.app import app
from tests.finetune.quantized_ckpt import write_fp8
from tests.finetune.torchrun import ROOT
from tests.finetune.torchrun import torchrun as run_torchrun
from tests.glm5cli.test_finetune_distill import PROMPTS, _prompt_file, teacher  # noqa: F401  (a fixture)
from tests.glm5cli.test_finetune_sft import ckpt, kill_and_resume  # noqa: F401  (ckpt: a fixture)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})


@pytest.fixture(scope="module")
def fp8_student(ckpt, tmp_path_factory):  # noqa: F811
    path = tmp_path_factory.mktemp("fp8")
    shutil.copytree(ckpt, path, dirs_exist_ok=True)
    return write_fp8(ckpt, path)


def _args(student, teacher, tmp_path, out) -> list[str]:  # noqa: F811
    a = _prompt_file(tmp_path / "a.jsonl", PROMPTS)
    b = _prompt_file(tmp_path / "b.jsonl", ["SELECT 1;", "-- a comment on the table"])
    args = ["finetune", "distill", str(student), "--qlora", "--teacher", f"code={teacher}", "--teacher", "sql=base"]
    args += ["--prompts", f"code={a}", "--tasks", f"sql={b}", "--out", str(out), "--steps", "4", "--lr", "5e-3"]
    return [*args, "--prompts-per-step", "5", "--max-new-tokens", "4", "--rank", "4", "--save-every", "0", "--json"]


def _log(out) -> list[float]:
    return [json.loads(line)["reverse_kl"] for line in (out / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_ranks_distil_an_fp8_student_as_one_process(fp8_student, teacher, tmp_path):  # noqa: F811
    one = tmp_path / "one"
    r = runner.invoke(app, _args(fp8_student, teacher, tmp_path, one))
    assert r.exit_code == 0, r.output
    two = tmp_path / "two"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="300")
    p = run_torchrun(2, "-m", "glm5cli", *_args(fp8_student, teacher, tmp_path, two), env=env)
    summary = json.loads(p.stdout[p.stdout.index("{") :])  # one summary: rank 0's
    assert p.stdout.count('"out"') == 1 and summary["prompts"] == {"code": 4, "sql": 2}
    want, got = _log(one), _log(two)
    assert len(got) == 4 and all(abs(a - b) <= 1e-3 * max(1.0, abs(b)) for a, b in zip(got, want, strict=True)), (
        got,
        want,
    )
    a, b = (
        load_file(one / "adapter" / "adapter_model.safetensors"),
        load_file(two / "adapter" / "adapter_model.safetensors"),
    )
    assert a.keys() == b.keys()
    moved = max(float(t.abs().max()) for k, t in a.items() if "lora_B" in k)
    assert moved > 0  # the adapter trained (B starts at zero)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-3 * moved
    record = json.loads((two / "adapter" / "adapter_base.json").read_text())
    assert record["trained_over"] == "fp8"


def test_under_torchrun_distill_needs_qlora(ckpt, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    job = DistillJob(ckpt, tmp_path / "o", ["base"], [str(_prompt_file(tmp_path / "p.jsonl", PROMPTS))])
    with pytest.raises(UsageError, match="add --qlora"):
        DistillRun(job, Quiet())


def test_a_qlora_adapter_teacher_is_refused_with_what_to_give(fp8_student, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    p = _prompt_file(tmp_path / "p.jsonl", PROMPTS)
    r = runner.invoke(app, ["finetune", "distill", str(fp8_student), "--qlora", "--teacher", str(adapter),
                            "--prompts", str(p), "--out", str(tmp_path / "o"), "--steps", "1"])  # fmt: skip
    assert r.exit_code != 0 and "is a LoRA adapter" in r.output and "--merge" in r.output


def test_a_qlora_distillation_resumes_exactly_after_a_kill(fp8_student, teacher, tmp_path, monkeypatch):  # noqa: F811
    import finetune.distill as distill

    a = _prompt_file(tmp_path / "a.jsonl", PROMPTS[:2])
    opts = ["--qlora", "--teacher", str(teacher), "--prompts", str(a), "--steps", "5", "--save-every", "2"]
    opts += ["--rank", "4", "--prompts-per-step", "2", "--max-new-tokens", "3"]
    whole, resumed = kill_and_resume("distill", fp8_student, opts, distill, "train", 5, tmp_path, monkeypatch)
    assert _log(resumed) == _log(whole)


def test_qlora_with_full_is_a_usage_error(fp8_student, tmp_path):
    p = _prompt_file(tmp_path / "p.jsonl", PROMPTS)
    r = runner.invoke(app, ["finetune", "distill", str(fp8_student), "--qlora", "--full", "--teacher", "base",
                            "--prompts", str(p), "--out", str(tmp_path / "o")])  # fmt: skip
    assert r.exit_code == 2 and "not with --full" in r.output and "--qat" not in r.output
