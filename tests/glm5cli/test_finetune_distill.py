"""`glm5 finetune distill`: a run folder (adapter, settings, per-step log) whose adapter is closer to the teacher
than the student was, a teacher per domain with `base` among them, exact resume after a kill, and bad input as
a clear usage error."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from typer.testing import CliRunner

from finetune.distill import completion_logprobs
from finetune.sft import load_adapter
from glm5cli.app import app
from model import GLM5ForCausalLM
from tests.glm5cli.test_finetune_sft import ckpt, kill_and_resume  # noqa: F401 (ckpt: the peaky tiny checkpoint)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})
PROMPTS = ["def add(a, b):", "import os", "# count the lines", "class Stack:"]


@pytest.fixture(scope="module")
def teacher(ckpt, tmp_path_factory):  # noqa: F811
    """The student's checkpoint with a random rank-4 LoRA delta merged in: a teacher a few nats per token away
    (reverse KL ~2.7 on these prompts' continuations) that a rank-4 adapter can reach, same tokenizer."""
    from finetune.lora import LoraSettings, add_lora, merge_lora

    path = tmp_path_factory.mktemp("teacher")
    shutil.copytree(ckpt, path, dirs_exist_ok=True)
    net = add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(rank=4, alpha=8), seed=1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in net.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.03)
    merge_lora(net).save_pretrained(path)
    return path


def _prompt_file(path, texts, **extra):
    path.write_text("".join(json.dumps({"prompt": t, **extra}) + "\n" for t in texts))
    return path


def _reverse_kl(student, teacher, ids_list, n=4):
    """Mean full-vocabulary reverse KL over the student's greedy continuations (n tokens) of each prompt."""
    from finetune.distill import sample_batch

    total = 0.0
    with torch.no_grad():
        for ids in ids_list:
            comp = sample_batch(student, [ids], n, 0.0, None)[0]
            s = completion_logprobs(student, ids, comp)
            t = completion_logprobs(teacher, ids, comp)
            total += float((s.exp() * (s - t)).sum(-1).mean())
    return total / len(ids_list)


def test_distill_writes_a_run_folder_whose_adapter_moved_towards_the_teacher(ckpt, teacher, tmp_path):  # noqa: F811
    a = _prompt_file(tmp_path / "a.jsonl", PROMPTS)
    b = _prompt_file(tmp_path / "b.jsonl", ["SELECT 1;"])
    out = tmp_path / "d"
    args = ["finetune", "distill", str(ckpt), "--teacher", f"code={teacher}", "--teacher", "sql=base"]
    args += ["--prompts", f"code={a}", "--tasks", f"sql={b}", "--out", str(out), "--steps", "20", "--lr", "5e-3"]
    r = runner.invoke(app, [*args, "--prompts-per-step", "5", "--max-new-tokens", "4", "--rank", "4", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["prompts"] == {"code": 4, "sql": 1} and summary["tokens_per_s"] > 0
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == list(range(1, 21))
    assert abs(log[0]["reverse_kl"] - summary["reverse_kl_first"]) < 1e-3
    record = json.loads((out / "distill_run.json").read_text())
    assert record["settings"]["teachers"] == {"code": str(teacher.resolve()), "sql": "base"}
    assert not (out / "state.pt").exists() and not (tmp_path / ".d.partial").exists()
    # The adapter loads onto the student's checkpoint as `glm5 serve STUDENT --lora` loads it (no base mismatch),
    # and the adapted student is closer to the teacher on the code prompts than the student was (measured on
    # greedy continuations: the log's per-step KL is of each step's own samples, too noisy to assert on).
    from serve.engine.llm import load_tokenizer

    tok = load_tokenizer(ckpt)
    ids = [tok.encode(t) for t in PROMPTS]
    base = GLM5ForCausalLM.from_pretrained(ckpt).eval()
    tnet = GLM5ForCausalLM.from_pretrained(teacher).eval()
    before = _reverse_kl(base, tnet, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapted = load_adapter(base, out / "adapter").eval()
    after = _reverse_kl(adapted, tnet, ids)
    assert after < 0.8 * before, (before, after)


def test_distill_resumes_exactly_after_a_kill(ckpt, teacher, tmp_path, monkeypatch):  # noqa: F811
    import finetune.distill as distill

    a = _prompt_file(tmp_path / "a.jsonl", PROMPTS[:2])
    opts = ["--teacher", str(teacher), "--prompts", str(a), "--steps", "5", "--save-every", "2", "--rank", "4"]
    opts += ["--prompts-per-step", "2", "--max-new-tokens", "3"]
    whole, resumed = kill_and_resume("distill", ckpt, opts, distill, "train", 5, tmp_path, monkeypatch)
    log_whole = [json.loads(x) for x in (whole / "train_log.jsonl").read_text().splitlines()]
    log_resumed = [json.loads(x) for x in (resumed / "train_log.jsonl").read_text().splitlines()]
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in log_resumed] == [
        {k: v for k, v in r.items() if k not in drop} for r in log_whole
    ]


def test_distill_help_explains_the_command():
    r = runner.invoke(app, ["finetune", "distill", "--help"])
    assert r.exit_code == 0
    for words in ("--teacher", "base", "reverse KL", "--kl", "--lora", "resumes"):
        assert words in r.output, words


@pytest.mark.parametrize(
    "extra, msg",
    [
        ([], "no teacher"),
        (["--teacher", "base", "--teacher", "base"], "two teachers for domain 'default'"),
        (["--teacher", "nowhere"], "not a checkpoint"),
        (["--teacher", "other=base"], "no teacher for the prompts of domain(s) ['default']"),
        (["--teacher", "base", "--teacher", "x=base"], "no prompts for the teacher(s) of domain(s) ['x']"),
        (["--teacher", "base", "--full"], "--full trains no adapter"),
        (["--teacher", "base", "--kl", "forward"], "--kl must be full or sampled"),
    ],
)
def test_distill_bad_input_is_a_usage_error(tiny_checkpoint, tmp_path, extra, msg):  # noqa: F811
    a = _prompt_file(tmp_path / "a.jsonl", PROMPTS[:1])
    out = tmp_path / "d"
    r = runner.invoke(
        app, ["finetune", "distill", str(tiny_checkpoint), "--prompts", str(a), "--out", str(out), *extra]
    )
    assert r.exit_code == 2 and msg in " ".join(r.output.split()), r.output
    assert not out.exists()


def test_distill_bad_prompt_line_is_named(tiny_checkpoint, tmp_path):  # noqa: F811
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    args = ["finetune", "distill", str(tiny_checkpoint), "--teacher", "base", "--prompts", str(bad)]
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and f"{bad}:2" in " ".join(r.output.split()).replace(" ", ""), r.output


@pytest.mark.slow
def test_distill_resumes_exactly_after_kill_9(ckpt, teacher, tmp_path):  # noqa: F811
    """A real `kill -9` once the first checkpoint is on disk; the rerun ends with the adapter and the log of a
    run that was never interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    a = _prompt_file(tmp_path / "a.jsonl", PROMPTS[:2])

    def cmd(out):
        args = [sys.executable, "-m", "glm5cli", "finetune", "distill", str(ckpt), "--teacher", str(teacher)]
        args += ["--prompts", str(a), "--out", str(out), "--steps", "12", "--save-every", "2", "--rank", "4"]
        return args + ["--prompts-per-step", "2", "--max-new-tokens", "3"]

    whole = tmp_path / "whole"
    subprocess.run(cmd(whole), check=True, capture_output=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / ".killed.partial" / "state.pt"
    while not state.exists() and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert state.exists() and not out.exists()
    r = subprocess.run(cmd(out), capture_output=True, text=True)
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr
    a_, b_ = (
        load_file(whole / "adapter" / "adapter_model.safetensors"),
        load_file(out / "adapter" / "adapter_model.safetensors"),
    )
    assert a_.keys() == b_.keys() and all(torch.equal(a_[k], b_[k]) for k in a_)
    logs = [
        [json.loads(x)["reverse_kl"] for x in (d / "train_log.jsonl").read_text().splitlines()] for d in (whole, out)
    ]
    assert logs[0] == logs[1] and len(logs[0]) == 12
