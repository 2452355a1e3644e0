"""The agent client's SSE reading: its `data:` line loop (agent/client.py) against the same loop on httpx-sse's
EventSource, on the same streamed chat completion (an in-memory transport, no network); prints the ratio.

Issue 17 asked for httpx-sse unless it measured slower. It measured slower here in six runs (1.07-1.6x the
whole streamed call, up to ~18 us more per event, on the shared 2-core machine; see benchmarks/agent_sse.json),
so the client keeps its loop. Issue 45 asked again: with the two variants interleaved after a warm-up (the first
version ran ours first, cold, and its ratio swung 0.5-1.3x between runs), httpx-sse took 1.15-1.29x the whole
streamed call in seven runs on 2026-12-05 at load 4-5 (median 17.7-37 ms against 14.3-29 ms; about 0.8 us more per
event), so the client still keeps its loop. Each run streams one reply of N_CHUNKS content deltas (one token per
event, as servers send them) through `ChatClient.query`; the httpx-sse variant is swapped in for `_post_stream`.

    python benchmarks/bench_agent_sse.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import client as client_mod  # noqa: E402
from agent.client import ChatClient, ClientConfig, _Assembler  # noqa: E402

N_CHUNKS = 4000
REPEATS = 35
WARMUP = 5  # calls of each variant left out: the first ones pay for imports and caches


def body() -> bytes:
    base = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    out = []
    for i in range(N_CHUNKS):
        out.append({**base, "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}]})
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in out) + b"data: [DONE]\n\n"


PAYLOAD = body()


def handler(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=PAYLOAD)


def sse_post_stream(self, body, on_delta, abandoned):  # the client's loop written on httpx-sse, as measured
    from httpx_sse import EventSource

    asm = _Assembler()
    with self._http.stream("POST", "/chat/completions", json=body) as r:
        for event in EventSource(r).iter_sse():
            data = event.data.strip()
            if not data:
                continue
            if data == "[DONE]":
                break
            asm.add(json.loads(data), on_delta)
    return asm.result()


def client(post_stream) -> ChatClient:
    c = ChatClient(
        ClientConfig(base_url="http://bench/v1", record_tokens=False), transport=httpx.MockTransport(handler)
    )
    c._post_stream = post_stream.__get__(c)
    return c


def timed(clients: list[ChatClient]) -> list[float]:
    """The median seconds of a streamed call through each client, the clients taking turns (in alternating order),
    so a busy moment of the shared machine falls on both."""
    times: list[list[float]] = [[] for _ in clients]
    for i in range(WARMUP + REPEATS):
        order = list(range(len(clients)))[:: 1 if i % 2 else -1]
        for k in order:
            t0 = time.perf_counter()
            resp = clients[k].query([{"role": "user", "content": "x"}])
            if i >= WARMUP:
                times[k].append(time.perf_counter() - t0)
            assert resp.content.startswith("tok0 ") and resp.finish_reason == "stop"
    return [statistics.median(t) for t in times]


def main() -> None:
    ours, sse = timed([client(client_mod.ChatClient._post_stream), client(sse_post_stream)])
    result = {"chunks": N_CHUNKS, "httpx_sse_s": round(sse, 4), "client_loop_s": round(ours, 4),
              "httpx_sse_over_client_loop": round(sse / ours, 3)}  # fmt: skip
    print(json.dumps(result))
    Path(__file__).with_name("agent_sse.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
