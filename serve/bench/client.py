"""One benchmark request over HTTP: stream it and time every piece that arrives.

TTFT is the time to the first chunk that carries generated text (or reasoning); ITL is every gap after that;
token counts come from the server's `usage` (requested with `stream_options.include_usage`), falling back to the
number of text-bearing chunks when a server sends none. The stream is read with httpx-sse (`aconnect_sse`).

`api_url(base_url, path)`: the server may be given as `http://host:port` or `http://host:port/v1` (what
`glm5 code` and the openai client take); both reach `/v1/...`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx
from httpx_sse import aconnect_sse

from serve.bench.dataset import BenchRequest


@dataclass
class RequestResult:
    success: bool = False
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # seconds, end to end
    itl: list[float] = field(default_factory=list)  # seconds between successive text chunks
    prompt_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    error: str = ""


def api_url(base_url: str, path: str) -> str:
    """`path` (e.g. "/chat/completions") under the server's /v1, whether or not `base_url` already ends in it."""
    root = base_url.rstrip("/")
    if not root.endswith("/v1"):
        root += "/v1"
    return root + path


def build_body(req: BenchRequest, api: str, model: str, stream: bool, ignore_eos: bool) -> dict:
    body: dict = {"model": model, "max_tokens": req.output_len, "temperature": 0.0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True  # sglang / vLLM / glm5 extension: generate exactly max_tokens
    if api == "chat":
        messages = [{"role": "system", "content": req.system}] if req.system else []
        body["messages"] = [*messages, {"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = (req.system + "\n\n" if req.system else "") + req.prompt
    return body


def _delta_text(chunk: dict, api: str) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if api == "chat":
        delta = choices[0].get("delta") or {}
        text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or []:
            text += (call.get("function") or {}).get("arguments") or ""
        return text
    return choices[0].get("text") or ""


async def send_request(
    client: httpx.AsyncClient,
    base_url: str,
    req: BenchRequest,
    api: str,
    model: str,
    stream: bool = True,
    ignore_eos: bool = True,
) -> RequestResult:
    """POST one request to `base_url`/v1/(chat/)completions; never raises, failures are in the result."""
    url = api_url(base_url, "/chat/completions" if api == "chat" else "/completions")
    res = RequestResult()
    body = build_body(req, api, model, stream, ignore_eos)
    start = time.perf_counter()
    try:
        if not stream:
            r = await client.post(url, json=body)
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return res
            data = r.json()
            res.latency = res.ttft = time.perf_counter() - start
            choice = data["choices"][0]
            res.text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
            usage = data.get("usage") or {}
            res.prompt_tokens, res.output_tokens = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            res.success = True
            return res
        last = None
        pieces: list[str] = []
        chunks_with_text = 0
        async with aconnect_sse(client, "POST", url, json=body) as source:
            r = source.response
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return res
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    res.error = str(chunk["error"])
                    return res
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                    res.output_tokens = chunk["usage"].get("completion_tokens", 0)
                text = _delta_text(chunk, api)
                if not text:
                    continue
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
                chunks_with_text += 1
                pieces.append(text)
        res.latency = time.perf_counter() - start
        res.text = "".join(pieces)
        res.output_tokens = res.output_tokens or chunks_with_text
        res.success = last is not None or res.output_tokens == 0
        if not res.success:
            res.error = "the stream ended without any generated text"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res
