"""`glm5 finetune rl --rollout-url A --rollout-url B` through a whole run against two `glm5 serve` servers that speak
sglang's API as sglang defines it (strict sampling keys, adapter registry, pause state, API key): every push is
pause -> load under the version's own name -> continue, on both servers; every later /generate names that adapter;
sessions stick to one server; the old adapters are unloaded; nothing is sent without the key.

What the client sends is also checked with sglang's own classes (tests/serve/test_engine_contracts.py), so what
passes here passes against sglang.
"""

from __future__ import annotations

import json

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from glm5cli.app import app
from serve.http.app import create_app
from serve.http.server import load_engine
from serve.http.settings import ServerSettings
from tests.glm5cli.test_finetune_sft import ckpt  # noqa: F401 (a fixture: the peaky tiny checkpoint)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401 (the fixture ckpt builds on)
from tests.serve.server_thread import ServerThread

runner = CliRunner(env={"COLUMNS": "300"})
CONTROL = ("/pause_generation", "/continue_generation", "/load_lora_adapter", "/unload_lora_adapter")


class Recorder:
    """ASGI wrapper: (path, status, JSON body) of every request, in the order their answers start."""

    def __init__(self, app):
        self.app, self.seen = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks = []

        async def recv():
            msg = await receive()
            chunks.append(msg.get("body", b""))
            return msg

        async def snd(msg):
            if msg["type"] == "http.response.start":
                # recorded before the client can see the answer: a test that reads `seen` as soon as its client
                # got a response finds it there (appending after the app returned raced the client under load)
                raw = b"".join(chunks)
                self.seen.append((scope["path"], msg["status"], json.loads(raw) if raw.strip() else None))
            await send(msg)

        await self.app(scope, recv, snd)


@pytest.fixture
def two_servers(ckpt):  # noqa: F811
    servers = []
    try:
        for _ in range(2):
            engine, tok = load_engine(ckpt, None, False, 8, 512, Console(quiet=True), kv_cache_gib=0.02,
                                      prefix_caching=False)  # fmt: skip
            rec = Recorder(create_app(engine, tok, ServerSettings("tiny", api_key="sekret")))
            s = ServerThread(rec).__enter__()
            s.wait_healthy()
            s.engine, s.rec = engine, rec
            servers.append(s)
        yield servers
    finally:
        for s in servers:
            s.__exit__(None, None, None)
            s.engine.shutdown()


def test_a_whole_run_over_two_sglang_api_servers(two_servers, ckpt, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    args = ["finetune", "rl", str(ckpt), "--out", str(out), "--env", "scripted", "--steps", "2", "--group-size", "2"]
    args += ["--groups-per-step", "2", "--max-new-tokens", "4", "--max-turns", "2", "--max-model-len", "512"]
    args += ["--rank", "4", "--max-staleness", "1", "--json"]
    for s in two_servers:
        args += ["--rollout-url", s.url + "/v1"]
    no_key = runner.invoke(app, [*args, "--out", str(tmp_path / "nokey")], env={"GLM5_API_KEY": ""})
    assert no_key.exit_code != 0 and "answered 401" in no_key.output, no_key.output  # the servers want the key
    # every request it made was refused (which one comes first can depend on what the process already knows of
    # the servers: a health or model probe, a weight push or a /generate)
    codes = {code for s in two_servers for path, code, _ in s.rec.seen if path != "/health"}
    assert codes == {401}, (no_key.output, [(s.url, s.rec.seen) for s in two_servers])
    for s in two_servers:
        s.rec.seen.clear()
    r = runner.invoke(app, args, env={"GLM5_ROLLOUT_API_KEY": "sekret"})
    assert r.exit_code == 0, r.output
    assert not [f for f in out.rglob("*.json*") if "sekret" in f.read_text(errors="replace")]  # the key is not kept
    log = [json.loads(line) for line in (out / "rl_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [1, 2]

    pushes = 3  # one when the run starts (the servers then serve the trainer's weights), one after each step
    for s in two_servers:
        seen = [(p, code, body) for p, code, body in s.rec.seen if p in CONTROL or p == "/generate"]
        assert all(code == 200 for _, code, _ in seen), [x for x in seen if x[1] != 200][:3]
        control = [(p, body) for p, _, body in seen if p in CONTROL]
        loads = [b["lora_name"] for p, b in control if p == "/load_lora_adapter"]
        assert loads == [f"glm5-rl-v{v}" for v in range(pushes)]
        for i, (p, _) in enumerate(control):  # sglang's documented flow around every load
            if p == "/load_lora_adapter":
                assert control[i - 1] == ("/pause_generation", {"mode": "in_place"}) and control[i + 1][0] == (
                    "/continue_generation"
                )
        generates = [body for p, _, body in seen if p == "/generate"]
        assert generates and all(set(b["sampling_params"]) <= {"max_new_tokens", "temperature", "sampling_seed"}
                                 for b in generates)  # fmt: skip
        assert all(b.get("lora_path", "").startswith("glm5-rl-v") for b in generates)  # never the bare base
        unloaded = [b["lora_name"] for p, b in control if p == "/unload_lora_adapter"]
        assert set(unloaded) <= set(loads[:-1])  # only old versions, never the one served
        r2 = httpx.post(s.url + "/load_lora_adapter", json={"lora_name": loads[-1], "lora_path": "x"},
                        headers={"Authorization": "Bearer sekret"})  # fmt: skip
        assert r2.status_code == 400 and "already exists" in r2.json()["error_message"]
    # session-affine routing: both servers sampled, and each session's calls went to one of them
    assert all(any(p == "/generate" for p, _, _ in s.rec.seen) for s in two_servers)


def test_glm5_serve_refuses_what_sglang_refuses_and_holds_requests_while_paused(two_servers):
    import threading
    import time

    s = two_servers[0]
    key = {"Authorization": "Bearer sekret"}

    def gen(body, timeout=60):
        return httpx.post(s.url + "/generate", json=body, headers=key, timeout=timeout)

    r = gen({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "seed": 1}})
    assert r.status_code == 400 and "sampling_seed" in r.text  # sglang's SamplingParams has no `seed`
    r = gen({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "frequency_penalty": 0.5}})
    assert r.status_code == 400 and "not supported by glm5 serve" in r.text
    r = gen({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}, "lora_path": "nope"})
    assert r.status_code == 400 and "not loaded" in r.text
    assert httpx.post(s.url + "/pause_generation", json={"mode": "later"}, headers=key).status_code == 400
    assert httpx.post(s.url + "/pause_generation", json={"mode": "retract"}).status_code == 401

    assert httpx.post(s.url + "/pause_generation", json={"mode": "retract"}, headers=key).status_code == 200
    done = []
    t = threading.Thread(target=lambda: done.append(gen({"input_ids": [1, 2],
                                                         "sampling_params": {"max_new_tokens": 2}})))  # fmt: skip
    t.start()
    time.sleep(1.5)
    assert not done  # held while paused, as sglang holds it
    assert httpx.post(s.url + "/continue_generation", json={}, headers=key).status_code == 200
    t.join(60)
    assert done and done[0].status_code == 200 and len(done[0].json()["output_ids"]) == 2


def test_pause_in_abort_mode_ends_the_running_requests(two_servers):
    """sglang's default mode: running requests come back at once with finish reason abort."""
    import threading
    import time

    s = two_servers[1]
    key = {"Authorization": "Bearer sekret"}
    done = []
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
    t = threading.Thread(target=lambda: done.append(httpx.post(s.url + "/generate", json=body, headers=key,
                                                               timeout=120)))  # fmt: skip
    t.start()
    time.sleep(1.0)
    assert httpx.post(s.url + "/pause_generation", json={}, headers=key).status_code == 200  # mode: abort
    t.join(60)
    assert done and done[0].status_code == 200, done
    meta = done[0].json()["meta_info"]
    assert meta["finish_reason"] == {"type": "abort"} and meta["completion_tokens"] < 500
    assert httpx.post(s.url + "/continue_generation", json={}, headers=key).status_code == 200


def test_a_resumed_run_replaces_the_adapter_an_earlier_run_left_under_its_name(two_servers, ckpt, tmp_path):  # noqa: F811
    """A run killed after pushing v3 and resumed pushes v3 again: sglang refuses a name already loaded, so the
    client unloads its own earlier adapter and loads the new one, instead of failing the run."""
    from finetune.lora import LoraSettings, add_lora, save_adapter
    from finetune.rl.remote import HttpServer
    from model import GLM5ForCausalLM

    adapter = tmp_path / "adapter"
    save_adapter(add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(rank=4, alpha=8)), adapter)
    s = two_servers[0]
    first = HttpServer(s.url, api_key="sekret")
    first.load_lora_adapter("glm5-rl", str(adapter), 3)
    again = HttpServer(s.url, api_key="sekret")  # the resumed run's client knows nothing of the first
    again.load_lora_adapter("glm5-rl", str(adapter), 3)
    loads = [(p, code) for p, code, _ in s.rec.seen if p in ("/load_lora_adapter", "/unload_lora_adapter")]
    assert loads == [("/load_lora_adapter", 200), ("/load_lora_adapter", 400), ("/unload_lora_adapter", 200),
                     ("/load_lora_adapter", 200)]  # fmt: skip
    assert again.adapter == ("glm5-rl-v3", 3)
