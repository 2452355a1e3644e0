"""`glm5 serve MODEL_DIR` as a user runs it: a real process that loads a tiny checkpoint, answers the openai
client once warm, and exits cleanly on Ctrl-C. Plus the flag checks that need no model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
from typer.testing import CliRunner

from glm5cli.app import app
from tests.serve.conftest import find_free_port, tiny_checkpoint  # noqa: F401  (a fixture)


@pytest.mark.slow
def test_serve_embedded_process(tiny_checkpoint):  # noqa: F811 (the imported fixture)
    port = find_free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "glm5cli",
            "serve",
            str(tiny_checkpoint),
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "256",
            "--api-key",
            "k",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/health").status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200, "server never became healthy"
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.usage.completion_tokens <= 4 and client.models.list().data[0].model_extra["max_model_len"] == 256
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out
    assert "loaded" in out and "ready" in out and f"http://127.0.0.1:{port}/v1" in out


def test_serve_flag_errors(tmp_path):
    runner = CliRunner(env={"COLUMNS": "300"})
    r = runner.invoke(app, ["serve", str(tmp_path / "missing")])
    assert r.exit_code == 1 and "not a checkpoint directory" in r.output
    r = runner.invoke(app, ["serve", str(tmp_path), "--dry-run"])
    assert r.exit_code == 2 and "--engine sglang" in r.output
    r = runner.invoke(app, ["serve", str(tmp_path), "--quant", "int8"])
    assert r.exit_code == 2 and "int4" in r.output
    r = runner.invoke(app, ["serve", str(tmp_path), "--dtype", "float16"])
    assert r.exit_code == 2 and "bfloat16" in r.output
    r = runner.invoke(app, ["serve", "m", "--engine", "vllm", "--quant", "int4"])
    assert r.exit_code == 1 and "embedded engine" in r.output
    # --draft-vocab: only with MTP drafts, a readable list of token ids, embedded engine only.
    vocab = tmp_path / "vocab.json"
    vocab.write_text("[1, 2, 3]")
    r = runner.invoke(app, ["serve", str(tmp_path), "--draft-vocab", str(vocab)])
    assert r.exit_code == 2 and "--speculative mtp" in r.output
    for text, msg in [("[1, 2", "not JSON"), ('{"ids": [1]}', "expected a list of token ids"), ("[1, true]", "list")]:
        vocab.write_text(text)
        r = runner.invoke(app, ["serve", str(tmp_path), "--speculative", "mtp", "--draft-vocab", str(vocab)])
        assert r.exit_code == 2 and msg in r.output and "vocab.json" in r.output, r.output
    r = runner.invoke(app, ["serve", str(tmp_path), "--speculative", "mtp", "--draft-vocab", str(tmp_path / "none")])
    assert r.exit_code == 2 and "cannot read the draft vocabulary" in r.output
    r = runner.invoke(app, ["serve", "m", "--engine", "sglang", "--draft-vocab", str(vocab)])
    assert r.exit_code == 1 and "embedded engine" in r.output


def test_int4_on_a_merged_checkpoint_warns_and_says_how_to_serve_the_adapter(tmp_path, monkeypatch):
    """`finetune rl --merge` leaves MODEL/adapter; serving MODEL with --quant int4 rounds the merged weights anew:
    the command says to serve the base with --lora instead (and still serves)."""
    import serve.http.server as server

    calls = []
    monkeypatch.setattr(server, "run_embedded", lambda **kw: calls.append(kw) or 0)
    runner = CliRunner(env={"COLUMNS": "300"})
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_base.json").write_text('{"base_model_name_or_path": "/ckpt/sft"}')
    r = runner.invoke(app, ["serve", str(tmp_path), "--quant", "int4"])
    assert r.exit_code == 0 and len(calls) == 1, r.output
    assert "merged" in r.output and f"glm5 serve /ckpt/sft --quant int4 --lora {tmp_path / 'adapter'}" in r.output
    for argv in (["serve", str(tmp_path)], ["serve", str(tmp_path / "adapter"), "--quant", "int4"]):
        r = runner.invoke(app, argv)  # full precision, or a checkpoint without a merged adapter: no warning
        assert r.exit_code == 0 and "merged" not in r.output, r.output


def test_an_adapter_trained_on_int4_weights_warns_when_served_without_int4(tmp_path, monkeypatch):
    """An adapter from `finetune rl --quant int4` (adapter_base.json's quant) was trained on the base's INT4
    weights: `--lora` without `--quant int4` warns and says to add it; with it, the adapter reaches the engine."""
    import serve.http.server as server

    calls = []
    monkeypatch.setattr(server, "run_embedded", lambda **kw: calls.append(kw) or 0)
    runner = CliRunner(env={"COLUMNS": "300"})
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_base.json").write_text('{"base_model_name_or_path": "/ckpt/sft", "quant": "int4"}')
    r = runner.invoke(app, ["serve", str(tmp_path), "--lora", str(adapter)])
    assert r.exit_code == 0 and "trained on" in r.output and "Add --quant int4" in r.output, r.output
    assert calls[-1]["lora"] is None and calls[-1]["adapt"] is not None  # merged into the full-precision weights
    r = runner.invoke(app, ["serve", str(tmp_path), "--lora", str(adapter), "--quant", "int4"])
    assert r.exit_code == 0 and "trained on" not in r.output, r.output
    assert calls[-1]["lora"] == adapter and calls[-1]["quant"] == "int4"  # beside the int4 weights


def test_an_empty_api_key_is_refused_not_read_as_no_key(tmp_path, monkeypatch):
    # `--api-key ''`, or GLM5_API_KEY set but empty (typer reads it as unset), served with no auth at all
    for args, env in (([tmp_path, "--api-key", ""], None), ([tmp_path], ""),
                      ([tmp_path, "--engine", "sglang", "--dry-run", "--api-key", " "], None)):  # fmt: skip
        if env is None:
            monkeypatch.delenv("GLM5_API_KEY", raising=False)
        else:
            monkeypatch.setenv("GLM5_API_KEY", env)
        r = CliRunner().invoke(app, ["serve", *map(str, args)])
        assert r.exit_code == 2 and "the API key is empty" in " ".join(r.output.split()), (args, r.output)


def test_serve_lora_says_the_adapter_is_loaded(tmp_path, monkeypatch, tiny_checkpoint):  # noqa: F811
    # the report: `serve --lora` said nothing of the adapter; the user could not tell it was used
    import serve.http.server as server
    from finetune.lora import LoraSettings, add_lora, save_adapter
    from model import GLM5ForCausalLM

    save_adapter(add_lora(GLM5ForCausalLM.from_pretrained(tiny_checkpoint), LoraSettings(rank=2)), tmp_path / "ad",
                 base=str(tiny_checkpoint))  # fmt: skip

    def run_embedded(**kw):  # the engine's load: the checkpoint, then the command's adapt
        kw["adapt"](GLM5ForCausalLM.from_pretrained(kw["model_dir"]))
        return 0

    monkeypatch.setattr(server, "run_embedded", run_embedded)
    r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["serve", str(tiny_checkpoint), "--lora", str(tmp_path / "ad")])
    assert r.exit_code == 0 and f"LoRA adapter {tmp_path / 'ad'}: loaded and merged" in r.output, r.output
