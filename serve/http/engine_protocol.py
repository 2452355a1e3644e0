"""What the HTTP app needs from an engine, and nothing more: the contract between serve/http and serve/engine.

The embedded engine (serve/engine) implements it; the tests' scripted engine implements it too. `params` is the
engine's own `SamplingParams` (serve/engine/sampling_params.py); the app never passes stop *strings* to the engine
(it cuts them itself, on text it has decoded, so the engine only sees stop token ids).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable


class EngineOutput(Protocol):
    """One update of a running request. Lists are cumulative (everything generated so far), as in vLLM.

    `logprobs[i]` belongs to `token_ids[i]` and has `.token_id`, `.logprob` and `.top` (token id -> logprob).
    `finish_reason` is None while running, then "stop" (eos / stop token), "length", or "abort".
    """

    request_id: str
    token_ids: Sequence[int]
    logprobs: Sequence[Any] | None
    finish_reason: str | None


class EngineBusy(RuntimeError):
    """The engine's queue is full; the app answers 429."""


@runtime_checkable
class AsyncEngine(Protocol):
    max_model_len: int
    weights_version: int | str

    def generate(self, prompt_token_ids: list[int], params: Any, request_id: str) -> AsyncIterator[EngineOutput]:
        """Start a request; iterate to get its updates. Closing the iterator early must free the request."""
        ...

    def abort(self, request_id: str) -> Any:
        """Stop a request and free its KV blocks (may be a coroutine function)."""
        ...

    # Optional: `healthy` (bool property); when present and False, /health answers 503.
    # Optional: `named_weights() -> dict` and `async update_weights(state_dict) -> version`, for the weight-update
    # routes (serve/http/weight_updates.py); without them those routes answer 400.

    def metrics(self) -> dict[str, float]:
        """Gauges and counters; the app reads the keys it knows: num_running, num_waiting, kv_cache_usage,
        prefix_cache_hit_rate, num_free_blocks, num_total_blocks, spec_accepted_tokens, spec_draft_tokens."""
        ...
