"""One engine request as a stream of `Step`s: new tokens, their logprobs, the text they complete, and the finish.

This is where a request meets the engine: it decodes text incrementally, cuts stop strings (and aborts the
engine request when one appears, so its KV blocks are freed at once), records the latency metrics, and -- if the
consumer goes away (client disconnect, task cancelled) -- aborts the engine request in a cancellation-shielded
cleanup, whatever state the stream was in.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from serve.engine.detokenizer import Detokenizer
from serve.engine.sampling_params import SamplingParams
from serve.http.errors import bad_request
from serve.http.state import ServerState, new_id


@dataclass
class Step:
    """What one engine output adds: the text it completes, its new token ids and logprobs, the finish if any."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Result(Step):
    """What a finished generation adds up to: its Steps summed, and what the engine said of the request."""

    stop_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # The engine's weights version when the first and the last token were sampled (they differ when a weight
    # update landed mid-request); None from an engine whose outputs do not say.
    first_weights_version: int | str | None = None
    weights_version: int | str | None = None


class Generation:
    def __init__(
        self,
        state: ServerState,
        prompt_ids: list[int],
        params: SamplingParams,
        stops: list[str] = (),
        request_id: str | None = None,
    ):
        self.state = state
        self.prompt_ids = prompt_ids
        self.params = params
        self.request_id = request_id or new_id("req")
        skip = set(state.eos_ids) | set(params.stop_token_ids)
        # No prompt context and no special tokens skipped by name: the eos and stop token ids are left out.
        self.detok = Detokenizer(state.tokenizer, (), False, skip_ids=skip, stops=stops)
        self.result = Result(prompt_tokens=len(prompt_ids))
        self.arrival = time.perf_counter()

    async def steps(self) -> AsyncIterator[Step]:
        """Yield Steps until the request finishes; the last one has `finish_reason` set."""
        state, res = self.state, self.result
        done = False
        ttft, gaps, last = None, [], None
        await state.pause.wait()  # held while /pause_generation holds, as sglang holds new requests
        agen = state.engine.generate(self.prompt_ids, self.params, self.request_id)
        state.pause.running.add(self.request_id)
        try:
            while True:
                try:
                    out = await agen.__anext__()
                except StopAsyncIteration:
                    break
                except ValueError as e:
                    if res.token_ids:
                        raise
                    # The engine refused the request when adding it (its own checks): the client's fault, a 400.
                    # Nothing was added, so nothing is aborted: the id may be a running request's (a reused rid).
                    done = True
                    raise bad_request(f"the engine refused the request: {e}") from None
                now = time.perf_counter()
                new_ids = list(out.token_ids[len(res.token_ids) :])
                new_lps = list((out.logprobs or [])[len(res.logprobs) :]) if self.params.logprobs is not None else []
                res.cached_tokens = getattr(out, "num_cached_tokens", res.cached_tokens) or res.cached_tokens
                version = getattr(out, "weights_version", None)
                if version is not None and new_ids:
                    if res.first_weights_version is None:
                        res.first_weights_version = version
                    res.weights_version = version
                if new_ids:
                    if ttft is None:
                        ttft = now - self.arrival
                    elif last is not None:
                        gaps.append((now - last) / len(new_ids))
                    last = now
                res.token_ids += new_ids
                res.logprobs += new_lps
                text = self.detok.add(new_ids)
                finish = out.finish_reason
                if self.detok.stop is not None:
                    finish, res.stop_reason = "stop", self.detok.stop
                elif finish is not None:
                    text += self.detok.flush()
                    if self.detok.stop is not None:
                        finish, res.stop_reason = "stop", self.detok.stop
                res.text += text
                if finish is not None:
                    res.finish_reason = finish
                    done = out.finish_reason is not None
                    stop_id = getattr(out, "stop_reason", None)
                    if res.stop_reason is None and stop_id in self.params.stop_token_ids:
                        res.stop_reason = stop_id  # a requested stop token id, as vLLM reports it (eos: None)
                    yield Step(text, new_ids, new_lps, finish)
                    return
                yield Step(text, new_ids, new_lps)
            # The engine ended the stream without a finish reason: treat it as an abort.
            res.finish_reason = "abort"
            done = True
            yield Step(finish_reason="abort")
        finally:
            with anyio.CancelScope(shield=True):
                state.pause.running.discard(self.request_id)
                if not done:
                    await state.abort(self.request_id)
                    res.finish_reason = res.finish_reason or "abort"
                await agen.aclose()
                if res.finish_reason is not None:
                    state.metrics.record_request(
                        ttft,
                        gaps,
                        time.perf_counter() - self.arrival,
                        len(self.prompt_ids),
                        len(res.token_ids),
                        res.finish_reason,
                    )

    async def run(self) -> Result:
        async for _ in self.steps():
            pass
        return self.result
