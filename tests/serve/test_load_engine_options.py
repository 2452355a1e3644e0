"""`glm5 serve --quant int4 --speculative mtp`: the embedded engine built with both, generating."""

from __future__ import annotations

import asyncio

from rich.console import Console

from model.int4_linear import Int4Linear
from serve.engine import SamplingParams
from serve.http.server import load_engine
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)


def test_load_engine_with_int4_weights_and_mtp_drafts(tiny_checkpoint):  # noqa: F811
    vocab = tuple(range(0, 4000, 2))  # drafts from a draft vocabulary: the lm_head stays high precision
    engine, tok = load_engine(
        tiny_checkpoint, "int4", True, 4, 256, Console(quiet=True), 0.01, num_draft_tokens=2, draft_vocab=vocab
    )
    try:
        llm_engine = engine.core
        model = llm_engine.model
        assert any(isinstance(m, Int4Linear) for m in model.modules())
        assert llm_engine.config.speculative == "mtp" and llm_engine.config.num_draft_tokens == 2
        assert llm_engine.runner.draft_ids.tolist() == list(vocab)

        async def run():
            outs = [
                o
                async for o in engine.generate(
                    tok.encode("def add(a, b):"), SamplingParams(max_tokens=8, ignore_eos=True, seed=1), "r1"
                )
            ]
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


def test_load_engine_in_bfloat16_generates(tiny_checkpoint):  # noqa: F811
    """`glm5 serve --dtype bfloat16`: the model and its KV cache in bf16 (the CPU default is float32)."""
    import torch

    engine, tok = load_engine(tiny_checkpoint, None, False, 2, 128, Console(quiet=True), 0.01, dtype="bfloat16")
    try:
        core = engine.core
        assert next(core.model.parameters()).dtype == torch.bfloat16
        assert core.runner.kv.latent_NPK[0].dtype == torch.bfloat16

        async def run():
            return [
                o
                async for o in engine.generate(
                    tok.encode("x = 1"), SamplingParams(max_tokens=4, ignore_eos=True, seed=1), "r"
                )
            ][-1]

        assert len(asyncio.run(run()).token_ids) == 4
    finally:
        engine.shutdown()


def test_an_int4_checkpoint_is_served_as_int4_and_says_so(tiny_checkpoint, tmp_path):  # noqa: F811
    """A compressed-tensors INT4 checkpoint (`glm5 model quantize`, or `finetune sft --qat int4`'s OUT/int4) loads
    as INT4 without --quant, and the loaded line says so; a plain checkpoint's line does not."""
    from model.int4_write import quantize_checkpoint

    quantize_checkpoint(tiny_checkpoint, tmp_path / "int4", group_size=32)
    for path, said in ((tmp_path / "int4", True), (tiny_checkpoint, False)):
        console = Console(record=True, width=400)
        engine, _ = load_engine(path, None, False, 2, 128, console, 0.01)
        try:
            assert any(isinstance(m, Int4Linear) for m in engine.core.model.modules()) == said
            assert ("INT4 weights (the checkpoint's)" in console.export_text()) == said
        finally:
            engine.shutdown()
