"""The embedded engine (`serve.engine.AsyncLLM`) as the app's `AsyncEngine`.

AsyncLLM already has the shape the app needs (an async generator of cumulative outputs per request, abort,
metrics); this adds what the app reads off the engine itself (context length, weights version, block counts)
and turns its metrics dataclass into the dict of gauges /metrics exposes; and the two calls the weight-update
routes use (`named_weights`, `update_weights`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict

from serve.http.weight_updates import int4_layer_shapes


class EmbeddedEngine:
    def __init__(self, async_llm):
        self.llm = async_llm
        self.core = async_llm.engine  # the LLMEngine: max_model_len, weights_version, block_manager

    @property
    def max_model_len(self) -> int:
        return int(self.core.max_model_len)

    @property
    def weights_version(self) -> int:
        return self.core.weights_version

    @property
    def healthy(self) -> bool:
        """False once the engine thread has died (every request would fail): /health turns 503."""
        thread = getattr(self.llm, "_thread", None)
        return getattr(self.llm, "_error", None) is None and (thread is None or thread.is_alive())

    def named_weights(self) -> dict:
        """name -> the served tensor (parameters and buffers), for the weight-update routes to read."""
        return dict(self.core.model.state_dict())

    def int4_layers(self) -> dict:
        """name -> (out_features, in_features) of every INT4 layer, which takes an adapter beside its weight."""
        return int4_layer_shapes(self.core.model)

    async def update_weights(self, state_dict: dict, low_rank: dict | None = None) -> int:
        """Load `state_dict` in place between two engine steps (and INT4 layers' adapter factors, `low_rank`);
        -> the new weights version."""
        return await self.llm.update_weights(state_dict, low_rank)

    def generate(self, prompt_token_ids: list[int], params, request_id: str) -> AsyncIterator:
        return self.llm.generate(list(prompt_token_ids), params, request_id)

    def abort(self, request_id: str) -> None:
        self.llm.abort(request_id)

    def metrics(self) -> dict:
        m = asdict(self.llm.metrics())
        bm = self.core.block_manager
        m["num_free_blocks"] = bm.num_free_blocks
        m["num_total_blocks"] = bm.num_blocks
        # The engine's speculative counters under the names /metrics publishes (absent without speculation).
        if m.get("spec_draft_tokens_total"):
            m["spec_draft_tokens"] = m["spec_draft_tokens_total"]
            m["spec_accepted_tokens"] = m["spec_accepted_tokens_total"]
            m["spec_accept_rate"] = m["spec_acceptance_rate"]
            m["spec_accept_length"] = m["spec_mean_acceptance_length"]
        return m

    def shutdown(self) -> None:
        self.llm.shutdown()
