"""`glm5 finetune align-mtp` as a user runs it: from recorded trajectories and from a prompts file to a new
checkpoint whose main model is bit-identical and whose draft vocabulary `glm5 serve` reads; bad input named."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from agent.trajectory import TrajectoryWriter
from glm5cli.app import app
from serve.engine.spec_decode import read_draft_vocab
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})


def _trajectory(path):
    w = TrajectoryWriter(path)
    w.write("session", id="s1", schema="glm5-trajectory/1", tools=[])
    convo = [{"role": "user", "content": "add a function that adds two numbers"}]
    for i, answer in enumerate(["def add(a, b):\n    return a + b", "Done: `add` is in utils.py."]):
        w.write("message", index=len(convo) - 1, message=convo[-1])
        reply = {"role": "assistant", "content": answer, "reasoning_content": f"step {i}"}
        w.write("model_call", step=i, n_messages=len(convo), response={"choices": [{"message": reply}]})
        convo += [reply, {"role": "user", "content": "thanks"}]
    w.write("model_call", step=9, n_messages=len(convo), response={"error": "timeout"})  # no answer: skipped
    w.close()


def test_align_mtp_from_trajectories_and_prompts(tiny_checkpoint, tmp_path):  # noqa: F811
    sessions = tmp_path / "sessions"
    _trajectory(sessions / "a.jsonl")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "def fib(n):"}\n\n{"messages": [{"role": "user", "content": "write a test"}]}\n'
        '{"prompt": "import os\\n"}\n'
    )
    out = tmp_path / "aligned"
    args = ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(out), "--trajectories", str(sessions)]
    args += ["--prompts", str(prompts), "--max-new-tokens", "12", "--steps", "6", "--batch-size", "2", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["from_trajectories"] == 2 and summary["from_prompts"] == 3 and summary["steps"] == 6
    assert summary["trained_tokens"] > 3 * 12
    # A full checkpoint: tokenizer and templates from the input, the same main weights, a changed MTP layer.
    for name in ("config.json", "tokenizer.json", "chat_template.jinja", "model.safetensors", "draft_vocab.json"):
        assert (out / name).is_file(), name
    before, after = load_file(tiny_checkpoint / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    mtp = "model.layers.3."  # tiny: 3 main layers, the MTP layer after them
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(mtp) for k in changed), sorted(changed)[:4]
    vocab = read_draft_vocab(out / "draft_vocab.json")
    assert len(vocab) == 8192 // 16 and len(set(vocab)) == len(vocab)  # few distinct tokens: V/16
    assert not (tmp_path / ".aligned.partial").exists()  # assembled aside, then renamed into place
    assert not {"run.json", "sequences.json", "state.pt"} & {p.name for p in out.iterdir()}
    # The output feeds `glm5 serve --speculative mtp --draft-vocab` (the flags are checked before loading).
    r = runner.invoke(
        app, ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(out), "--prompts", str(prompts)]
    )
    assert r.exit_code == 1 and "already exists" in r.output


@pytest.mark.parametrize(
    "text, msg",
    [
        ('{"prompt": "ok"}\n{"prompt": \n', "prompts.jsonl:2: not JSON"),
        ('{"prompt": "ok"}\n{"text": "x"}\n', 'prompts.jsonl:2: expected {"prompt": "text"}'),
        ("\n\n", "no prompts"),
    ],
)
def test_bad_prompt_files_name_file_and_line(tiny_checkpoint, tmp_path, text, msg):  # noqa: F811
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(text)
    r = runner.invoke(
        app, ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(tmp_path / "o"), "--prompts", str(prompts)]
    )
    assert r.exit_code == 2 and msg in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_align_mtp_usage_errors(tiny_checkpoint, tmp_path):  # noqa: F811
    base = ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(tmp_path / "o")]
    r = runner.invoke(app, base)
    assert r.exit_code == 2 and "nothing to train on" in r.output
    r = runner.invoke(app, [*base, "--trajectories", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "does not exist" in r.output
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, [*base, "--trajectories", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no trajectory" in r.output
    (tmp_path / "bad.jsonl").write_text('{"type": "message"}\n')
    r = runner.invoke(app, [*base, "--trajectories", str(tmp_path / "bad.jsonl")])
    assert r.exit_code == 2 and "bad.jsonl" in r.output and "not a glm5 trajectory" in r.output
    r = runner.invoke(app, ["finetune", "align-mtp", str(tmp_path), "--out", str(tmp_path / "o"), "--prompts", "x"])
    assert r.exit_code == 1 and "not a checkpoint directory" in r.output


def test_align_mtp_refuses_int4_checkpoints(tiny_checkpoint, tmp_path):  # noqa: F811
    q = tmp_path / "int4"
    r = runner.invoke(app, ["model", "quantize", str(tiny_checkpoint), "--out", str(q), "--observer", "minmax"])
    assert r.exit_code == 0, r.output
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x = 1"}\n')
    r = runner.invoke(app, ["finetune", "align-mtp", str(q), "--out", str(tmp_path / "o"), "--prompts", str(prompts)])
    assert r.exit_code == 1 and "INT4" in r.output and "glm5 model quantize" in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_a_killed_run_resumes_from_its_last_checkpoint(tiny_checkpoint, tmp_path, monkeypatch):  # noqa: F811
    """Killed after its checkpoint at step 4 of 6, the same command resumes there (data not generated again) and
    ends with exactly the weights of a run that was never interrupted."""
    import finetune.mtp_align as mtp_align

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "for i in range(3):"}\n{"prompt": "import re"}\n')
    opts = ["--prompts", str(prompts), "--max-new-tokens", "10", "--steps", "6", "--save-every", "2"]
    opts += ["--batch-size", "2"]
    whole = tmp_path / "whole"
    assert (
        runner.invoke(app, ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(whole), *opts]).exit_code == 0
    )

    real = mtp_align.train_mtp
    saves = []

    def killed_after_second_save(*a, save, **kw):
        def save_then_die(state):
            save(state)
            saves.append(state["step"])
            if len(saves) == 2:
                raise KeyboardInterrupt  # as if the process were killed right after writing it

        return real(*a, save=save_then_die, **kw)

    out = tmp_path / "resumed"
    monkeypatch.setattr(mtp_align, "train_mtp", killed_after_second_save)
    r = runner.invoke(app, ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(out), *opts])
    assert r.exit_code != 0 and saves == [2, 4] and not out.exists()
    work = tmp_path / ".resumed.partial"
    assert {"run.json", "sequences.json", "state.pt"} <= {p.name for p in work.iterdir()}
    monkeypatch.setattr(mtp_align, "train_mtp", real)
    monkeypatch.setattr(mtp_align, "generate_sequences", lambda *a, **k: pytest.fail("generated again"))
    # Other settings do not silently mix with the interrupted run.
    r = runner.invoke(app, ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(out), *opts, "--lr", "1e-2"])
    assert r.exit_code == 1 and "other settings" in r.output
    r = runner.invoke(app, ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(out), *opts])
    assert r.exit_code == 0, r.output
    assert "resuming" in r.output and "from step 4 of 6" in r.output
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not work.exists()


def test_a_prompt_too_long_for_the_context_is_named_and_leaves_nothing(tiny_checkpoint, tmp_path):  # noqa: F811
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "x = 1\n" * 3000}) + "\n")
    out = tmp_path / "o"
    r = runner.invoke(
        app, ["finetune", "align-mtp", str(tiny_checkpoint), "--out", str(out), "--prompts", str(prompts)]
    )
    assert r.exit_code == 2 and "long.jsonl" in r.output and "max_model_len" in r.output, r.output
    assert not out.exists() and not (tmp_path / ".o.partial").exists()
