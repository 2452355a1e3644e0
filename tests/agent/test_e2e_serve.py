"""End to end: `glm5 code -p` against a real `glm5 serve` process over a tiny random checkpoint.

This proves the wire protocol between our agent and our server (OpenAI chat completions, streaming, GLM-5
rendering and parsing, the trajectory written from it), not the model's skill: a random tiny model writes
nonsense, so the agent runs with every tool call denied and a turn limit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import find_free_port, tiny_checkpoint  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def served_tiny(tiny_checkpoint):  # noqa: F811 (the imported fixture)
    port = find_free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "glm5cli", "serve", str(tiny_checkpoint), "--port", str(port),
         "--served-model-name", "glm5-tiny", "--max-model-len", "4096", "--api-key", "e2e-key"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("glm5 serve never became healthy:\n" + (proc.stdout.read() if proc.stdout else ""))
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


@pytest.mark.slow
def test_glm5_code_headless_against_glm5_serve(served_tiny, repo, tmp_path):
    root = str(Path(__file__).resolve().parents[2])  # the agent runs in the repo under test, not in ours
    env = {**os.environ, "E2E_KEY": "e2e-key", "COLUMNS": "200", "PYTHONPATH": root}
    before = (repo / "calc.py").read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "glm5cli", "code", "-p", "Fix the bug in calc.py", "--base-url", served_tiny,
         "--model", "glm5-tiny", "--api-key-env", "E2E_KEY", "--output-format", "json", "--approval", "deny",
         "--max-turns", "2", "--no-sandbox"],
        cwd=repo, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["type"] == "result" and result["session_id"]
    # What a random model writes is not ours to fix, so the one expected exit code follows from how the run
    # ended: the turn limit 3; the model stopped 0, or 4 when some of its calls were refused.
    expected = {"limits_exceeded": 3, "submitted": 4 if result["denied"] else 0}.get(result["exit_status"])
    assert expected is not None and proc.returncode == expected, proc.stdout + proc.stderr
    path = next(v for k, v in result.items() if "trajectory" in k)
    records = [json.loads(line) for line in open(path, encoding="utf-8")]
    calls = [r for r in records if r.get("type") == "model_call"]
    assert calls, f"no model call recorded: {[r.get('type') for r in records]}"
    # The server's answer came back in OpenAI form and was recorded raw, with usage from the server.
    first = calls[0]
    choice = first["response"]["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length", "tool_calls")
    assert first["usage"]["prompt_tokens"] > 0 and first["usage"]["completion_tokens"] > 0
    # Training data: the client asked our server for logprobs by default and recorded one per generated token
    # (issue 18: trajectories from glm5 code against glm5 serve held none).
    lps = (choice.get("logprobs") or {}).get("content") or []
    assert len(lps) == first["usage"]["completion_tokens"], (len(lps), first["usage"])
    # glm5 serve honours return_token_ids, as vLLM and sglang do. Random text can look like a secret to the
    # redactor (`token: abc123...`); then the ids are dropped, since they would decode back to it, and it says so.
    if choice["token_ids"] is None:
        assert choice["token_ids_dropped"], choice
    else:
        assert len(choice["token_ids"]) == len(lps)
    assert "e2e-key" not in json.dumps(records)  # the key never reaches the trajectory
    assert any(r.get("type") == "message" and r["message"]["role"] == "assistant" for r in records)
    # Nothing was allowed to change the repository.
    assert (repo / "calc.py").read_bytes() == before


@pytest.mark.slow
def test_client_learns_context_window_from_the_server(served_tiny):
    from agent.client import ChatClient, ClientConfig

    client = ChatClient(ClientConfig(base_url=served_tiny, model="glm5-tiny", api_key="e2e-key"))
    assert client.served_context_window() == 4096
    other = ChatClient(ClientConfig(base_url=served_tiny, model="not-served", api_key="e2e-key"))
    assert other.served_context_window() is None
