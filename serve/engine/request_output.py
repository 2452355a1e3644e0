"""What the engine reports about a request: everything generated so far, cumulative.

Streaming consumers take the difference between successive outputs of the same request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serve.engine.sequence import TokenLogprob


@dataclass
class RequestOutput:
    """`logprobs[i]` belongs to `token_ids[i]`: the sampled token's logprob under the distribution it was
    drawn from, and the top-n alternatives when the request asked for them. `finish_reason` is None while
    running, then "stop" (EOS, a stop token or a stop string), "length" (max_tokens or the context
    limit) or "abort". `stop_reason` is the stop token id or stop string that ended it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    weights_version: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
