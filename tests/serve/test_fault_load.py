"""Load and fault test: 64 concurrent streaming clients on the real engine, a quarter of which hang up at random
points. Afterwards every KV block is free, /health answers 200, and every client that stayed got exactly the
answer it gets when sent alone (greedy decoding). Loopback only, bounded in time."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from serve.http.app import create_app
from serve.http.settings import ServerSettings
from tests.serve.server_thread import ServerThread

MODEL = "tiny"
CLIENTS = 64
DISTINCT = 8
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(tiny_engine):
    engine, tok = tiny_engine
    app = create_app(engine, tok, ServerSettings(MODEL, max_in_flight=128))
    with ServerThread(app) as s:
        s.wait_healthy()
        s.engine, s.state = engine, app.state.glm5
        yield s


def body(i: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"client prompt {i % DISTINCT}: tell me something"}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }


async def stream_one(client: httpx.AsyncClient, i: int, hang_up_after: int | None) -> tuple[str, str | None] | None:
    """The streamed answer (text, finish_reason), or None for a client that hung up after `hang_up_after` chunks."""
    text, finish, chunks = "", None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body(i)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            choice = chunk["choices"][0]
            delta = choice["delta"]
            text += (delta.get("reasoning_content") or "") + "|" + (delta.get("content") or "")
            finish = choice["finish_reason"] or finish
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                return None  # leaving the block closes the connection mid-stream
    return text, finish


def test_64_clients_a_quarter_hang_up(server):
    rng = random.Random(7)
    quitters = set(rng.sample(range(CLIENTS), CLIENTS // 4))
    cut = {i: rng.randint(2, MAX_TOKENS // 2) for i in quitters}

    async def main():
        limits = httpx.Limits(max_connections=CLIENTS + 8)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
            alone = [await stream_one(c, i, None) for i in range(DISTINCT)]
            t0 = time.monotonic()
            together = await asyncio.gather(*(stream_one(c, i, cut.get(i)) for i in range(CLIENTS)))
            return alone, together, time.monotonic() - t0

    alone, together, took = asyncio.run(main())
    for i, got in enumerate(together):
        if i in quitters:
            assert got is None
        else:
            assert got == alone[i % DISTINCT], f"client {i} differs from its answer alone"
    assert all(a[1] == "length" for a in alone)

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = server.engine.metrics()
        if m["num_running"] == 0 and m["num_waiting"] == 0 and m["num_free_blocks"] == m["num_total_blocks"]:
            break
        time.sleep(0.05)
    m = server.engine.metrics()
    assert m["num_running"] == 0 and m["num_waiting"] == 0
    assert m["num_free_blocks"] == m["num_total_blocks"], "KV blocks leaked"
    assert server.state.in_flight == 0
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/health_generate").status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    assert f'glm5:request_success_total{{model_name="{MODEL}",finished_reason="abort"}} {CLIENTS // 4}' in metrics
    assert took < 60
