"""The model client: OpenAI-compatible Chat Completions over httpx.

One code path for `glm5 serve`, sglang, vLLM and hosted GLM-5 APIs. GLM-5 served with the GLM reasoning parser
sends its thinking as `reasoning_content` (some servers say `reasoning`) beside `content` and `tool_calls`; the
streamed deltas of all three are assembled here into one non-streamed-shaped response, which is what the
trajectory keeps (with token ids and logprobs when the server sent them).

Retries: timeouts, connection errors, 429 and 5xx are retried with exponential backoff (honouring Retry-After);
any other 4xx is the caller's mistake and is raised at once. A refused connection to this machine (nothing
listens there) fails at once: a local server does not appear within the backoff. A 400 that says the context is
too long becomes `ContextLengthError`, so the loop can compact and try again. Errors name the URL.

Training data: where `/models` says the server is one that returns them (`owned_by` glm5, vllm or sglang), every
request asks for per-token logprobs (`logprobs: true`) and token ids (`return_token_ids: true`: vLLM >= 0.10.2
and sglang answer with `token_ids` per choice and `prompt_token_ids`); a server that rejects those fields gets
the request again without them, and is not asked again.

The stream is read by its own `data:` line loop, not httpx-sse's EventSource: the library took 1.15-1.29x the
whole streamed call (benchmarks/bench_agent_sse.py, issue 45).

Knows nothing of tools or the loop: it takes messages and tool schemas and returns a `ModelResponse`.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


class APIError(Exception):
    """The endpoint answered with an error we should not (or can no longer) retry."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ContextLengthError(APIError):
    """The request does not fit the model's context window."""


class Cancelled(Exception):
    """The caller asked to stop (Esc in the TUI) while a response was streaming."""


@dataclass(frozen=True)
class ClientConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "glm-5"
    api_key: str | None = None
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_retries: int = 4
    backoff_s: float = 1.0  # first retry waits about this long, then doubles
    max_backoff_s: float = 30.0
    stream: bool = True
    temperature: float | None = None
    max_tokens: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)  # e.g. {"logprobs": true} or chat_template_kwargs
    record_tokens: bool = True  # ask for logprobs and token ids where the server is known to return them
    # OpenAI's `seed`: the session's n-th request carries seed + n, so a server that honors it (glm5 serve, vLLM,
    # sglang) samples the same session again, and two models given the same seed draw the same random numbers
    seed: int | None = None


# `owned_by` in /models -> the request fields that make that server return logprobs and token ids
TOKEN_FIELDS: dict[str, dict[str, Any]] = {
    "glm5": {"logprobs": True, "return_token_ids": True},
    "vllm": {"logprobs": True, "return_token_ids": True},
    "sglang": {"logprobs": True, "return_token_ids": True},
}
_LOOPBACK = ("127.", "localhost", "[::1]", "0.0.0.0")


@dataclass
class ModelResponse:
    """One assistant turn, assembled. `raw` is the response in the non-streamed OpenAI shape."""

    content: str
    reasoning_content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    usage: dict[str, Any]
    raw: dict[str, Any]
    latency_s: float = 0.0

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation (OpenAI format, reasoning kept)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


# Called with ("content" | "reasoning" | "tool_call", text) while a response streams in.
DeltaCallback = Callable[[str, str], None]


def _is_context_error(status: int, text: str) -> bool:
    t = text.lower()
    return status in (400, 413) and any(
        s in t for s in ("context length", "context_length", "maximum context", "too long", "context window")
    )


def api_root(base_url: str) -> str:
    """The URL the API's paths hang under. A bare server address (`http://127.0.0.1:8000`) means its `/v1`, as
    OpenAI-compatible servers (glm5 serve, sglang, vLLM) mount it; a URL with a path (a hosted API's
    `.../api/paas/v4`) is taken as given."""
    root = base_url.rstrip("/")
    if httpx.URL(root).path in ("", "/"):
        root += "/v1"
    return root


class ChatClient:
    """Talks to one endpoint. Thread-safe enough for one agent: one request at a time."""

    def __init__(self, config: ClientConfig, transport: httpx.BaseTransport | None = None):
        self.config = config
        headers = {"Content-Type": "application/json"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self.base_url = api_root(config.base_url)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            transport=transport,
        )
        self.cancel_event = threading.Event()
        self.sleep = time.sleep  # tests replace it to keep backoff instant
        self._model_card: dict[str, Any] | None = None
        self._token_fields: dict[str, Any] | None = None  # None: not decided yet
        self._queries = 0  # requests made (a retry of one is the same request)

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def local(self) -> bool:
        host = self.base_url.split("://", 1)[-1]
        return host.startswith(_LOOPBACK)

    def close(self) -> None:
        self._http.close()

    def model_card(self) -> dict[str, Any]:
        """Our model's entry in the server's `/models` ({} when it is not listed or cannot be reached); fetched
        once."""
        if self._model_card is None:
            self._model_card = {}
            try:
                r = self._http.get("/models", timeout=5.0)
                data = r.json().get("data", []) if r.status_code == 200 else []
            except (httpx.HTTPError, ValueError, AttributeError):
                data = []
            for entry in data if isinstance(data, list) else []:
                if isinstance(entry, dict) and entry.get("id") == self.config.model:
                    self._model_card = entry
        return self._model_card

    def served_context_window(self) -> int | None:
        """The context length the server reports for our model in `/models` (`max_model_len`, as glm5 serve,
        vLLM and sglang publish it), or None when it does not say or cannot be reached."""
        n = self.model_card().get("max_model_len")
        return int(n) if isinstance(n, int) and n > 0 else None

    def token_fields(self) -> dict[str, Any]:
        """The request fields that make this server return logprobs and token ids ({} when it is not known to)."""
        if self._token_fields is None:
            known = TOKEN_FIELDS.get(str(self.model_card().get("owned_by", "")).lower(), {})
            self._token_fields = dict(known) if self.config.record_tokens else {}
        return self._token_fields

    def query(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaCallback | None = None,
        **overrides: Any,
    ) -> ModelResponse:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, **self.token_fields()}
        if tools:
            body["tools"] = tools
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        if self.config.seed is not None:
            body["seed"] = (self.config.seed + self._queries) % 2**63
        self._queries += 1
        body.update(self.config.extra_body)
        body.update(overrides)
        stream = bool(body.pop("stream", self.config.stream))
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}

        # The call runs on its own thread so that a cancel (Esc) returns at once, even while the server has not
        # sent a byte yet; the abandoned call finishes or fails on its own and its deltas are dropped.
        abandoned = threading.Event()

        def guarded(kind: str, text: str) -> None:
            if on_delta is not None and not abandoned.is_set():
                on_delta(kind, text)

        box: dict[str, Any] = {}

        def work() -> None:
            try:
                try:
                    box["response"] = self._call(body, stream, guarded, abandoned)
                except APIError as e:
                    asked = [k for k in self._token_fields or {} if k in str(e) and k in body]
                    if e.status not in (400, 422) or not asked:
                        raise
                    # the server refuses the training-data fields: ask once more without them, and never again
                    for k in self._token_fields or {}:
                        body.pop(k, None)
                    self._token_fields = {}
                    box["response"] = self._call(body, stream, guarded, abandoned)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = e

        worker = threading.Thread(target=work, name="glm5-model-call", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if self.cancel_event.is_set() and worker.is_alive():
                abandoned.set()
                raise Cancelled()
        if "error" in box:
            raise box["error"]
        return box["response"]

    def _call(self, body: dict[str, Any], stream: bool, on_delta: DeltaCallback, abandoned: threading.Event):
        attempt = 0
        while True:
            t0 = time.monotonic()
            try:
                raw = self._post_stream(body, on_delta, abandoned) if stream else self._post(body)
                return _to_response(raw, time.monotonic() - t0)
            except _Retryable as e:
                attempt += 1
                if e.refused and self.local:
                    raise APIError(f"nothing is listening at {self.url}: {e}") from None
                if attempt > self.config.max_retries:
                    raise APIError(f"{self.url}: {e} (gave up after {self.config.max_retries} retries)",
                                   e.status) from None  # fmt: skip
                wait = e.retry_after
                if wait is None:
                    wait = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** (attempt - 1))
                    wait *= 0.5 + random.random() / 2
                if abandoned.is_set():
                    raise Cancelled() from None
                self.sleep(wait)

    # -- transport ---------------------------------------------------------------------------------------------

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = self._http.post("/chat/completions", json=body)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise _Retryable.of(e) from None
        _check_status(r.status_code, r.text, r.headers)
        try:
            return r.json()
        except json.JSONDecodeError:
            raise APIError(f"endpoint returned non-JSON: {r.text[:200]!r}", r.status_code) from None

    def _post_stream(self, body: dict[str, Any], on_delta: DeltaCallback, abandoned: threading.Event) -> dict[str, Any]:
        asm = _Assembler()
        try:
            with self._http.stream("POST", "/chat/completions", json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    _check_status(r.status_code, r.text, r.headers)
                ctype = r.headers.get("content-type", "")
                if "text/event-stream" not in ctype:  # server ignored stream=True
                    r.read()
                    return r.json()
                for line in r.iter_lines():
                    if abandoned.is_set() or self.cancel_event.is_set():
                        raise Cancelled()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk and not chunk.get("choices"):
                        raise APIError(f"stream error: {chunk['error']}")
                    asm.add(chunk, on_delta)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise _Retryable.of(e) from None
        return asm.result()


class _Retryable(Exception):
    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None,
                 refused: bool = False):  # fmt: skip
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.refused = refused

    @classmethod
    def of(cls, e: Exception) -> _Retryable:
        refused = isinstance(e, httpx.ConnectError) and "refused" in str(e).lower()
        return cls(f"{type(e).__name__}: {e}", refused=refused)


def _check_status(status: int, text: str, headers: httpx.Headers) -> None:
    if status < 400:
        return
    if status == 429 or status >= 500:
        ra = headers.get("retry-after")
        try:
            retry_after = float(ra) if ra is not None else None
        except ValueError:
            retry_after = None
        raise _Retryable(f"HTTP {status}: {text[:300]}", status, retry_after)
    if _is_context_error(status, text):
        raise ContextLengthError(f"HTTP {status}: {text[:300]}", status)
    raise APIError(f"HTTP {status}: {text[:500]}", status)


class _Assembler:
    """Folds streamed chunks into one response in the non-streamed shape."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.logprobs: list[Any] = []
        self.token_ids: list[int] = []
        self.extra: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any], on_delta: DeltaCallback | None) -> None:
        for k in ("id", "model", "created", "system_fingerprint"):
            if k in chunk and k not in self.meta:
                self.meta[k] = chunk[k]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if "prompt_token_ids" in chunk:
            self.extra["prompt_token_ids"] = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self.content.append(text)
                if on_delta:
                    on_delta("content", text)
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                self.reasoning.append(thought)
                if on_delta:
                    on_delta("reasoning", thought)
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    tc.get("index", len(self.tool_calls)),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                name = fn.get("name")
                if name and name != slot["function"]["name"]:  # some servers repeat the name in every delta
                    slot["function"]["name"] += name
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
                    if on_delta:
                        on_delta("tool_call", fn["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            lp = choice.get("logprobs")
            if lp and lp.get("content"):
                self.logprobs.extend(lp["content"])
            if choice.get("token_ids"):
                self.token_ids.extend(choice["token_ids"])
            if "prompt_token_ids" in choice:
                self.extra["prompt_token_ids"] = choice["prompt_token_ids"]

    def result(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        if self.logprobs:
            choice["logprobs"] = {"content": self.logprobs}
        if self.token_ids:
            choice["token_ids"] = self.token_ids
        raw = {"object": "chat.completion", **self.meta, "choices": [choice], "usage": self.usage, **self.extra}
        return raw


def _to_response(raw: dict[str, Any], latency: float) -> ModelResponse:
    choices = raw.get("choices") or []
    if not choices:
        raise APIError(f"response has no choices: {json.dumps(raw)[:300]}")
    msg = choices[0].get("message") or {}
    tool_calls = []
    for i, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):  # some servers send a parsed object
            args = json.dumps(args if args is not None else {})
        tool_calls.append(
            {
                "id": tc.get("id") or f"call_{i}_{int(time.time() * 1000)}",
                "type": "function",
                "function": {"name": fn.get("name", ""), "arguments": args},
            }
        )
    return ModelResponse(
        content=msg.get("content") or "",
        reasoning_content=msg.get("reasoning_content") or msg.get("reasoning"),
        tool_calls=tool_calls,
        finish_reason=choices[0].get("finish_reason"),
        usage=raw.get("usage") or {},
        raw=raw,
        latency_s=latency,
    )
