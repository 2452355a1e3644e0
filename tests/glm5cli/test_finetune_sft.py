"""`glm5 finetune sft`: LoRA on recorded responses, a peft adapter that peft loads, a merged checkpoint with the
same logits, exact resume after a kill, and the bad inputs."""

from __future__ import annotations

import json

import peft
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from agent.trajectory import TrajectoryWriter
from glm5cli.app import app
from model import GLM5ForCausalLM
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})
ANSWER = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint, tmp_path_factory):  # noqa: F811
    """The tiny checkpoint with its lm_head scaled 20x. A random `tiny` squeezes its logits into a range of ~1
    (RMSNorm'd hidden times a small random head), so no adapter on the layers can make any token likely; a
    trained model's head has the range this one gets."""
    import shutil

    path = tmp_path_factory.mktemp("peaky")
    shutil.copytree(tiny_checkpoint, path, dirs_exist_ok=True)
    model = GLM5ForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(path)
    return path


def _sessions(folder, n=3):
    for k in range(n):
        w = TrajectoryWriter(folder / f"s{k}.jsonl")
        w.write("session", id=f"s{k}", schema="glm5-trajectory/1", tools=[])
        user = {"role": "user", "content": f"task {k}: write add"}
        w.write("message", index=0, message=user)
        w.write(
            "model_call",
            step=0,
            n_messages=1,
            response={"choices": [{"message": {"role": "assistant", "content": ANSWER}}]},
        )
        w.close()
    return folder


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))


def test_sft_learns_the_responses_and_writes_a_peft_adapter_and_a_merged_checkpoint(ckpt, tmp_path):
    sessions = _sessions(tmp_path / "sessions")
    out = tmp_path / "sft"
    args = ["finetune", "sft", str(ckpt), "--out", str(out), "--trajectories", str(sessions)]
    args += ["--steps", "40", "--lr", "3e-3", "--rank", "8", "--batch-size", "3", "--merge", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["examples"] == 3 and summary["loss_last"] < summary["loss_first"] / 4, summary
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "tokenizer.json").is_file()
    assert (out / "adapter_hf" / "adapter_config.json").is_file()  # for transformers: tests/finetune/test_lora_hf.py
    # peft itself loads the adapter onto the untouched base model...
    base = GLM5ForCausalLM.from_pretrained(ckpt).eval()
    ids = list(range(100, 140))
    before = _logits(base, ids)
    cfg = peft.LoraConfig.from_pretrained(str(out / "adapter"))
    adapted = peft.inject_adapter_in_model(cfg, base)
    res = peft.set_peft_model_state_dict(adapted, load_file(str(out / "adapter" / "adapter_model.safetensors")))
    assert not [k for k in res.missing_keys if "lora_" in k] and not res.unexpected_keys
    with_adapter = _logits(adapted.eval(), ids)
    assert (with_adapter - before).abs().max() > 1e-3  # the adapter changes the model...
    # ...and the merged checkpoint is the same function, as a plain model.
    merged = GLM5ForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, ids), with_adapter, atol=1e-4, rtol=1e-4)
    # `glm5 serve --lora` merges the adapter at load: the engine generates what the merged checkpoint does.
    from rich.console import Console

    from finetune.sft import load_adapter, merge_lora
    from serve.engine import LLM, SamplingParams
    from serve.http.server import load_engine

    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine, _ = load_engine(
        ckpt,
        None,
        False,
        2,
        256,
        Console(quiet=True),
        0.01,
        adapt=lambda m: merge_lora(load_adapter(m, out / "adapter")),
    )
    try:
        import asyncio

        async def gen():
            return [o async for o in engine.generate(ids, greedy, "r")][-1].token_ids

        served = asyncio.run(gen())
    finally:
        engine.shutdown()
    assert served == LLM(str(out), num_kv_blocks=64).generate([ids], greedy)[0].token_ids
    assert served != LLM(str(ckpt), num_kv_blocks=64).generate([ids], greedy)[0].token_ids  # the base differs
    # Only the main layers were adapted: the MTP layer is the base model's.
    a, b = load_file(ckpt / "model.safetensors"), load_file(out / "model.safetensors")
    mtp = "model.layers.3."
    assert all(torch.equal(a[k], b[k]) for k in a if k.startswith(mtp))
    assert any(not torch.equal(a[k], b[k]) for k in a if ".experts." in k)


def dies_after_first_save(real, saves: list):
    """`real` (a training loop taking `save=`) killed right after its first checkpoint, whose step goes in saves."""

    def loop(*a, save, **kw):
        def save_then_die(state):
            save(state)
            saves.append(state["step"])
            raise KeyboardInterrupt

        return real(*a, save=save_then_die, **kw)

    return loop


def kill_and_resume(command, ckpt, opts, module, loop_name, steps, tmp_path, monkeypatch):
    """Runs `glm5 finetune COMMAND` whole, then killed right after its first checkpoint (step 2) and rerun, and
    checks that the rerun resumed and wrote the same adapter. -> (whole run's dir, resumed run's dir)."""
    whole = tmp_path / "whole"
    assert runner.invoke(app, ["finetune", command, str(ckpt), "--out", str(whole), *opts]).exit_code == 0
    real, saves = getattr(module, loop_name), []
    out = tmp_path / "resumed"
    monkeypatch.setattr(module, loop_name, dies_after_first_save(real, saves))
    r = runner.invoke(app, ["finetune", command, str(ckpt), "--out", str(out), *opts])
    assert r.exit_code != 0 and saves == [2] and not out.exists()
    monkeypatch.setattr(module, loop_name, real)
    r = runner.invoke(app, ["finetune", command, str(ckpt), "--out", str(out), *opts])
    assert r.exit_code == 0 and f"from step 2 of {steps}" in r.output, r.output
    a = load_file(whole / "adapter" / "adapter_model.safetensors")
    b = load_file(out / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return whole, out


def test_sft_resumes_exactly_after_a_kill(tiny_checkpoint, tmp_path, monkeypatch):  # noqa: F811
    import finetune.sft as sft

    sessions = _sessions(tmp_path / "sessions", n=2)
    opts = ["--trajectories", str(sessions), "--steps", "6", "--save-every", "2", "--rank", "4", "--batch-size", "2"]
    kill_and_resume("sft", tiny_checkpoint, opts, sft, "train", 6, tmp_path, monkeypatch)


def test_serve_lora_flag_errors(tmp_path, tiny_checkpoint):  # noqa: F811
    r = runner.invoke(app, ["serve", str(tiny_checkpoint), "--lora", str(tmp_path)])
    assert r.exit_code == 2 and "not a LoRA adapter" in r.output
    r = runner.invoke(app, ["serve", "m", "--engine", "vllm", "--lora", str(tmp_path)])
    assert r.exit_code == 1 and "embedded engine" in r.output


@pytest.mark.parametrize("make, msg", [("empty", "no responses to train on"), ("missing", "does not exist")])
def test_sft_bad_input(tiny_checkpoint, tmp_path, make, msg):  # noqa: F811
    path = tmp_path / "t.jsonl"
    if make == "empty":
        w = TrajectoryWriter(path)
        w.write("session", id="s", schema="glm5-trajectory/1", tools=[])
        w.close()
    r = runner.invoke(
        app, ["finetune", "sft", str(tiny_checkpoint), "--out", str(tmp_path / "o"), "--trajectories", str(path)]
    )
    assert r.exit_code in (1, 2) and msg in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_sft_reports_bad_lines_and_strict_fails_on_them(tiny_checkpoint, tmp_path):  # noqa: F811
    sessions = _sessions(tmp_path / "sessions", n=2)
    path = sessions / "s0.jsonl"
    path.write_text(path.read_text() + '{"type": "model_call", "respo\n')
    base = ["finetune", "sft", str(tiny_checkpoint), "--trajectories", str(sessions), "--steps", "2", "--rank", "2"]
    r = runner.invoke(app, [*base, "--out", str(tmp_path / "o"), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    skipped = summary["data"]["skipped_records"]
    assert summary["data"]["sequences"] == 2 and len(skipped) == 1 and skipped[0].startswith(f"{path}:4: not JSON")
    assert f"skipped {path}:4" in r.stderr.replace("\n", "")
    assert summary["tokens_per_s"] and summary["tokens_per_s"] > 0
    r = runner.invoke(app, [*base, "--out", str(tmp_path / "o2"), "--strict"])
    assert r.exit_code == 2 and "s0.jsonl:4: not JSON" in r.output and not (tmp_path / "o2").exists()


def test_full_fine_tuning_writes_a_checkpoint_with_mtp_and_indexer_frozen(tiny_checkpoint, tmp_path):  # noqa: F811
    sessions = _sessions(tmp_path / "sessions", n=2)
    out = tmp_path / "full"
    args = ["finetune", "sft", str(tiny_checkpoint), "--out", str(out), "--trajectories", str(sessions), "--full"]
    r = runner.invoke(app, [*args, "--steps", "3", "--lr", "1e-3", "--router-bias-rate", "1e-2", "--json"])
    assert r.exit_code == 0, r.output
    a, b = load_file(tiny_checkpoint / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    mtp = "model.layers.3."
    assert not {k for k in changed if k.startswith(mtp) or ".indexer." in k}, sorted(changed)[:5]
    assert "model.layers.0.self_attn.q_a_proj.weight" in changed and "lm_head.weight" in changed
    assert any(k.endswith("e_score_correction_bias") for k in changed)  # the balancing rule moved the biases
    GLM5ForCausalLM.from_pretrained(out)  # a checkpoint `glm5 serve` loads
    r = runner.invoke(
        app,
        [
            "finetune",
            "sft",
            str(tiny_checkpoint),
            "--out",
            str(tmp_path / "x"),
            "--trajectories",
            str(sessions),
            "--train-mtp",
        ],
    )
    assert r.exit_code == 2 and "--full" in r.output


def test_full_sft_train_mtp_trains_the_mtp_layer_by_its_loss(tiny_checkpoint, tmp_path):  # noqa: F811
    """`--train-mtp` adds GLM-5's MTP loss: the MTP layer moves (it got no gradient from the LM loss alone) and
    the summary reports that loss; the indexers stay frozen."""
    sessions = _sessions(tmp_path / "sessions", n=2)
    out = tmp_path / "mtp"
    args = ["finetune", "sft", str(tiny_checkpoint), "--out", str(out), "--trajectories", str(sessions), "--full"]
    r = runner.invoke(app, [*args, "--train-mtp", "--mtp-steps", "2", "--steps", "2", "--lr", "1e-3", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["mtp_loss_last"] > 0
    a, b = load_file(tiny_checkpoint / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert "model.layers.3.eh_proj.weight" in changed and "model.layers.3.self_attn.q_a_proj.weight" in changed
    assert not {k for k in changed if ".indexer." in k}
    r = runner.invoke(app, [*args[:4], str(tmp_path / "mtp2"), *args[5:], "--train-mtp", "--steps", "1"])
    assert r.exit_code == 0 and "MTP layer was trained along" in r.output and "align-mtp" not in r.output, r.output


@pytest.mark.slow
def test_sft_resumes_exactly_after_kill_9(tiny_checkpoint, tmp_path):  # noqa: F811
    """A real `kill -9` of the process once its first checkpoint is on disk; the rerun ends with the adapter of
    a run that was never interrupted, bit for bit."""
    import os
    import signal
    import subprocess
    import sys
    import time

    sessions = _sessions(tmp_path / "sessions", n=2)

    def cmd(out):
        return [
            sys.executable,
            "-m",
            "glm5cli",
            "finetune",
            "sft",
            str(tiny_checkpoint),
            "--out",
            str(out),
            "--data",
            str(sessions),
            "--steps",
            "40",
            "--save-every",
            "2",
            "--rank",
            "4",
            "--batch-size",
            "2",
        ]

    whole = tmp_path / "whole"
    subprocess.run(cmd(whole), check=True, capture_output=True)
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / ".killed.partial" / "state.pt"
    while not state.exists() and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert state.exists() and not out.exists()  # killed mid-run, after a checkpoint
    r = subprocess.run(cmd(out), capture_output=True, text=True)
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr
    a = load_file(whole / "adapter" / "adapter_model.safetensors")
    b = load_file(out / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_dense_attention_trains_with_every_key_visible_and_keeps_the_checkpoints_top_k(ckpt, tmp_path):
    """--dense-attention: the first step's loss is the dense forward's (not the sparse one's: tiny's top-16 drops
    keys of these ~40-token sessions), every indexer (the MTP layer's too) is back to its top-k afterwards, and
    the checkpoint keeps index_topk."""
    import json as _json

    from finetune.dsa_warmup import dense_attention
    from model.indexer import Indexer

    sessions = _sessions(tmp_path / "sessions")
    first = {}
    for dense in (False, True):
        out = tmp_path / f"o{dense}"
        args = ["finetune", "sft", str(ckpt), "--out", str(out), "--trajectories", str(sessions), "--full",
                "--train-mtp", "--steps", "1", "--batch-size", "3", "--json"]  # fmt: skip
        r = runner.invoke(app, args + (["--dense-attention"] if dense else []))
        assert r.exit_code == 0, r.output
        first[dense] = _json.loads(r.stdout[r.stdout.index("{") :])["loss_first"]
        assert _json.loads((out / "config.json").read_text())["index_topk"] == 16
    assert first[True] != first[False]
    model = GLM5ForCausalLM.from_pretrained(ckpt)
    indexers = [m for m in model.modules() if isinstance(m, Indexer)]
    assert len(indexers) > model.config.num_hidden_layers - 1  # the MTP layer's indexer is among them
    with dense_attention(model):
        assert all(ix.topk > 1 << 40 for ix in indexers)
    assert {ix.topk for ix in indexers} == {16}


def test_a_prompt_that_fills_max_len_is_named_with_the_length_to_raise_it_to(tiny_checkpoint, tmp_path):  # noqa: F811
    # the report: "no responses to train on ... see the flags" when the ~1.7k-token prefix filled --max-len 512
    sessions = _sessions(tmp_path / "sessions", n=2)
    base = ["finetune", "sft", str(tiny_checkpoint), "--trajectories", str(sessions), "--out", str(tmp_path / "o")]
    r = runner.invoke(app, [*base, "--max-len", "8"])
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "fills --max-len" in said and "raise --max-len above" in said, r.output
    prefix = int(said.split("The shortest prompt before a model turn is ")[1].split(" ")[0])
    assert prefix > 8
    r = runner.invoke(app, [*base, "--max-len", str(prefix + 1), "--steps", "1", "--rank", "2", "--json"])
    assert r.exit_code == 0, r.output  # one token past the prompt: there is a response to train on


def test_offload_optimizer_trains_the_same_adapter_with_adamws_state_off_the_device(ckpt, tmp_path, monkeypatch):
    """--offload-optimizer: the optimizer is finetune/offload.py's HostAdamW (AdamW's state beside an fp32 master of
    each adapter weight, in host memory), and the adapter written is the one plain AdamW trains."""
    import finetune.train_loop as loop

    made = []
    real = loop.make_optimizer
    monkeypatch.setattr(loop, "make_optimizer", lambda params, cfg: made.append(real(params, cfg)) or made[-1])
    sessions = _sessions(tmp_path / "sessions")
    adapters = {}
    for offload in (False, True):
        out = tmp_path / f"o{offload}"
        args = ["finetune", "sft", str(ckpt), "--out", str(out), "--trajectories", str(sessions), "--steps", "3",
                "--rank", "4", "--lr", "1e-2", "--json"]  # fmt: skip
        r = runner.invoke(app, args + (["--offload-optimizer"] if offload else []))
        assert r.exit_code == 0, r.output
        adapters[offload] = load_file(out / "adapter" / "adapter_model.safetensors")
    assert [type(o).__name__ for o in made] == ["AdamW", "HostAdamW"]
    assert made[1].host_bytes() == 12 * sum(p.numel() for p in made[1].params)
    assert adapters[True].keys() == adapters[False].keys()
    assert all(torch.equal(adapters[True][k], adapters[False][k]) for k in adapters[False])
