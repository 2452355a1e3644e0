"""A scripted OpenAI-compatible chat endpoint for tests (a fake of what is outside the product: the model).

Runs in-process on 127.0.0.1 in a thread. Each POST /v1/chat/completions pops the next scripted reply:
    reply("text")                                  a final answer
    reply("text", tools=[("bash", {...})], reasoning="...")
    {"status": 500}                                an HTTP error (retry tests)
    callable(request_body) -> one of the above     to react to what the agent sent
Streams (SSE, deltas cut into small pieces, usage in the last chunk) when the request asks for it.
Every request body is kept in `requests`. GET /v1/models lists one model `owned_by` `FakeModel.owned_by`
("fake" by default: a server the client does not know; "vllm" to act as one); with `return_token_ids` the
response carries `prompt_token_ids` (one id per message) and `token_ids`, as vLLM's does.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def reply(content: str = "", tools: list[tuple[str, dict]] | None = None, reasoning: str | None = None,
          finish_reason: str | None = None, raw_args: str | None = None) -> dict[str, Any]:  # fmt: skip
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": n, "arguments": raw_args if raw_args is not None else json.dumps(a)},
        }  # fmt: skip
        for i, (n, a) in enumerate(tools or [])
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return {"message": msg, "finish_reason": finish_reason or ("tool_calls" if calls else "stop")}


class FakeModel:
    def __init__(self, script: list[Any] | None = None, prompt_tokens: int = 100):
        self.script = list(script or [])
        self.requests: list[dict[str, Any]] = []
        self.prompt_tokens = prompt_tokens
        self.lock = threading.Lock()
        self.owned_by = "fake"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                card = {"id": "fake-glm", "object": "model", "owned_by": fake.owned_by}
                data = json.dumps({"object": "list", "data": [card]}).encode()
                self.send_response(200 if self.path.rstrip("/").endswith("/models") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with fake.lock:
                    fake.requests.append(body)
                    item = fake.script.pop(0) if fake.script else reply("(script exhausted)")
                if callable(item):
                    item = item(body)
                if "status" in item:
                    data = json.dumps({"error": {"message": item.get("message", "scripted error")}}).encode()
                    self.send_response(item["status"])
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                usage = {"prompt_tokens": item.get("prompt_tokens", fake.prompt_tokens), "completion_tokens": 20,
                         "total_tokens": item.get("prompt_tokens", fake.prompt_tokens) + 20}  # fmt: skip
                want_lp = bool(body.get("logprobs"))
                prompt_ids = (
                    list(range(100, 100 + len(body.get("messages", [])))) if body.get("return_token_ids") else None
                )
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for n, chunk in enumerate(fake.chunks(item, usage, want_lp)):
                        if n == 0 and prompt_ids is not None:
                            chunk["prompt_token_ids"] = prompt_ids
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                choice = {"index": 0, **item}
                if want_lp:
                    pieces = fake.pieces(item["message"].get("content") or "")
                    choice["logprobs"] = {"content": [{"token": t, "logprob": -0.5} for t in pieces]}
                    choice["token_ids"] = list(range(len(pieces)))
                resp = {"id": "chatcmpl-fake", "object": "chat.completion", "model": body.get("model"),
                        "choices": [choice], "usage": usage}  # fmt: skip
                if prompt_ids is not None:
                    resp["prompt_token_ids"] = prompt_ids
                data = json.dumps(resp).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @staticmethod
    def pieces(text: str) -> list[str]:
        return [text[i : i + 7] for i in range(0, len(text), 7)]

    @staticmethod
    def chunks(item: dict[str, Any], usage: dict[str, Any], logprobs: bool = False):
        msg = item["message"]
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake"}

        def c(delta, finish=None):
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield c({"role": "assistant"})
        n = 0
        for key in ("reasoning_content", "content"):
            for piece in FakeModel.pieces(msg.get(key) or ""):
                chunk = c({key: piece})
                if logprobs and key == "content":
                    chunk["choices"][0]["logprobs"] = {"content": [{"token": piece, "logprob": -0.5}]}
                    chunk["choices"][0]["token_ids"] = [n]
                    n += 1
                yield chunk
        for i, tc in enumerate(msg.get("tool_calls") or []):
            yield c({"tool_calls": [{"index": i, "id": tc["id"], "type": "function",
                                     "function": {"name": tc["function"]["name"], "arguments": ""}}]})  # fmt: skip
            args = tc["function"]["arguments"]
            for j in range(0, len(args), 5):
                yield c({"tool_calls": [{"index": i, "function": {"arguments": args[j : j + 5]}}]})
        yield c({}, item["finish_reason"])
        yield {**base, "choices": [], "usage": usage}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
