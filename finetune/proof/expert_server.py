"""The expert behind an OpenAI-compatible endpoint: a small FastAPI app, served by uvicorn on 127.0.0.1.

`glm5 bench swe --agent glm5 --base-url URL` drives it exactly as it drives `glm5 serve`, so the expert's sessions
are recorded by the bench (trajectory, tool calls, tool results, grading) the way a model's are, and
`glm5 finetune sft --data RUN` reads them with no special case.

    GET  /v1/models             one model, "glm5-expert", owned_by "glm5-expert" (the client asks no logprobs)
    POST /v1/chat/completions   expert.next_message(messages); a JSON response, or the same as one SSE chunk
                                when the request streams. Usage is reported as zero tokens: no model ran.

`ExpertServer()` runs it in a background thread on a port the OS picks (`with ExpertServer() as s: s.base_url`);
`python -m finetune.proof.expert_server --port 0` runs it in the foreground and prints its URL.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at runtime

import argparse
import json
import socket
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from finetune.proof.expert import next_message

MODEL = "glm5-expert"


def make_app(slip_rate: float = 0.0):
    app = FastAPI(title="glm5 proof expert")
    app.state.requests = 0

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": MODEL}]}

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return JSONResponse({"error": {"message": "`messages` must be a non-empty list"}}, status_code=400)
        app.state.requests += 1
        msg = next_message(messages, slip_rate)
        finish = "tool_calls" if msg.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        meta = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": MODEL}
        if not body.get("stream"):
            choice = {"index": 0, "message": msg, "finish_reason": finish}
            return {"object": "chat.completion", **meta, "choices": [choice], "usage": usage}

        def sse():
            delta = {"role": "assistant", "content": msg.get("content")}
            if msg.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(msg["tool_calls"])]
            for choices in ([{"index": 0, "delta": delta, "finish_reason": None}],
                            [{"index": 0, "delta": {}, "finish_reason": finish}]):  # fmt: skip
                yield f"data: {json.dumps({'object': 'chat.completion.chunk', **meta, 'choices': choices})}\n\n"
            yield f"data: {json.dumps({'object': 'chat.completion.chunk', **meta, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return app


class ExpertServer:
    """The expert app under uvicorn in a daemon thread; a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, slip_rate: float = 0.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.app = make_app(slip_rate)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> "ExpertServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the expert endpoint did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Serve the repair family's scripted expert as an OpenAI endpoint.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    p.add_argument("--slip-rate", type=float, default=0.0, help="share of tasks with failed edits before the fix")
    args = p.parse_args(argv)
    with ExpertServer(args.host, args.port, args.slip_rate) as s:
        print(f"expert endpoint: {s.base_url}", flush=True)
        try:
            s.thread.join()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
