"""A scripted stand-in for the engine, for what a random-weight model cannot show: chosen outputs (reasoning,
tool calls, stop strings), a queue that is full on demand, and exact control of timing.

It implements serve/http's `AsyncEngine` the way the real engine does: cumulative outputs, one token per step,
`finish_reason` "stop" on an eos token (unless ignore_eos), "length" at max_tokens, "abort" after abort(); and
it holds fake "KV blocks" per live request so tests can check that every block comes back.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from serve.engine.sequence import TokenLogprob
from serve.http.engine_protocol import EngineBusy

BLOCK = 16


@dataclass
class Out:
    request_id: str
    token_ids: list[int]
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    num_cached_tokens: int = 0


class ScriptedEngine:
    def __init__(
        self, tokenizer, script="Hello there.", delay: float = 0.0, max_model_len: int = 256, num_blocks: int = 4096
    ):
        self.tokenizer = tokenizer
        self.script = script  # str, or callable(prompt_ids, params) -> str
        self.delay = delay
        self.max_model_len = max_model_len
        self.weights_version = "scripted-1"
        self.num_blocks = num_blocks
        self.live: dict[str, int] = {}  # request id -> blocks held
        self.aborted: set[str] = set()
        self.seen: list[tuple[list[int], object]] = []  # (prompt ids, params) of every request
        self.busy = False
        self.eos = tokenizer.eos_token_ids[0]

    def metrics(self) -> dict:
        used = sum(self.live.values())
        return {
            "num_running": len(self.live),
            "num_waiting": 0,
            "kv_cache_usage": used / self.num_blocks,
            "num_free_blocks": self.num_blocks - used,
            "num_total_blocks": self.num_blocks,
            "prefix_cache_hit_rate": 0.0,
        }

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    def text_for(self, prompt_ids, params) -> str:
        return self.script(prompt_ids, params) if callable(self.script) else self.script

    async def generate(self, prompt_ids, params, request_id):
        if self.busy:
            raise EngineBusy("scripted engine set busy")
        self.seen.append((list(prompt_ids), params))
        script_ids = self.tokenizer.encode(self.text_for(prompt_ids, params)) + [self.eos]
        ids: list[int] = []
        lps: list[TokenLogprob] = []
        self.live[request_id] = math.ceil(len(prompt_ids) / BLOCK)
        try:
            while True:
                await asyncio.sleep(self.delay)
                if request_id in self.aborted:
                    yield Out(request_id, list(ids), list(lps), "abort")
                    return
                k = len(ids)
                tok = script_ids[k] if k < len(script_ids) else self.tokenizer.encode(" more")[0]
                if tok == self.eos and params.ignore_eos:
                    tok = self.tokenizer.encode(" more")[0]
                ids.append(tok)
                lp = -0.25 * (k % 4) - 0.125
                top = {tok: lp, (tok + 1) % 100: lp - 1.0, (tok + 2) % 100: lp - 2.0}
                lps.append(TokenLogprob(tok, lp, dict(list(top.items())[: params.logprobs or 0])))
                self.live[request_id] = math.ceil((len(prompt_ids) + len(ids)) / BLOCK)
                finish = None
                if tok == self.eos or tok in params.stop_token_ids:
                    finish = "stop"
                elif len(ids) >= params.max_tokens:
                    finish = "length"
                yield Out(request_id, list(ids), list(lps), finish)
                if finish:
                    return
        finally:
            self.live.pop(request_id, None)
