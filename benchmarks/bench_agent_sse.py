"""The agent client's SSE reading: its `data:` line loop (agent/client.py) against the same loop on httpx-sse's
EventSource, on the same streamed chat completion (an in-memory transport, no network); prints the ratio.

Issue 17 asked for httpx-sse unless it measured slower. It measured slower here in six runs (1.07-1.6x the
whole streamed call, up to ~18 us more per event, on the shared 2-core machine; see benchmarks/agent_sse.json),
so the client keeps its loop. Each run streams one reply of N_CHUNKS content deltas (one token per event, as servers send them)
through `ChatClient.query`; the httpx-sse variant is swapped in for `_post_stream`.

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
REPEATS = 7


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


def timed(post_stream) -> float:
    c = ChatClient(
        ClientConfig(base_url="http://bench/v1", record_tokens=False), transport=httpx.MockTransport(handler)
    )
    c._post_stream = post_stream.__get__(c)
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        resp = c.query([{"role": "user", "content": "x"}])
        times.append(time.perf_counter() - t0)
        assert resp.content.startswith("tok0 ") and resp.finish_reason == "stop"
    return statistics.median(times)


def main() -> None:
    ours = timed(client_mod.ChatClient._post_stream)
    sse = timed(sse_post_stream)
    result = {"chunks": N_CHUNKS, "httpx_sse_s": round(sse, 4), "client_loop_s": round(ours, 4),
              "httpx_sse_over_client_loop": round(sse / ours, 3)}  # fmt: skip
    print(json.dumps(result))
    Path(__file__).with_name("agent_sse.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
