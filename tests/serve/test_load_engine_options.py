"""`glm5 serve --quant int4 --speculative mtp`: the embedded engine built with both, generating."""

from __future__ import annotations

import asyncio

from rich.console import Console

from model.quant_int4 import Int4Linear
from serve.engine import SamplingParams
from serve.http.server import load_engine
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)


def test_load_engine_with_int4_weights_and_mtp_drafts(tiny_checkpoint):  # noqa: F811
    engine, tok = load_engine(tiny_checkpoint, "int4", True, 4, 256, Console(quiet=True), 0.01, num_draft_tokens=2)
    try:
        llm_engine = engine.core
        model = llm_engine.model
        assert any(isinstance(m, Int4Linear) for m in model.modules())
        assert llm_engine.config.speculative == "mtp" and llm_engine.config.num_draft_tokens == 2

        async def run():
            outs = [o async for o in engine.generate(tok.encode("def add(a, b):"), SamplingParams(max_tokens=8), "r1")]
            return outs[-1]

        out = asyncio.run(run())
        assert len(out.token_ids) == 8 and out.finish_reason == "length"
        m = engine.metrics()
        assert m["spec_draft_tokens"] > 0 and 0 <= m["spec_accept_rate"] <= 1 and m["spec_accept_length"] >= 1

        from serve.http.metrics import ServerMetrics

        text = ServerMetrics("tiny").render(m, in_flight=0)
        assert "glm5:spec_accept_rate" in text and "glm5:spec_draft_tokens_total" in text
    finally:
        engine.shutdown()
