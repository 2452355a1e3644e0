"""Inference: the embedded engine, the OpenAI-compatible HTTP app, and launchers for sglang / vLLM.

Module map:
- engine/     the embedded PyTorch engine: `LLM`, `SamplingParams`, `AsyncLLM`, MTP speculative decoding, and
              serve's one text path (engine/detokenizer.py: DecodeStream + stop strings, the HTTP app's too)
              (see engine/__init__.py)
- http/       the OpenAI-compatible FastAPI app over an engine protocol: chat / completions / generate / health /
              metrics, GLM-5 rendering and parsing, auth, OpenAI-style errors; `run_embedded` for `glm5 serve`
- launchers/  sglang and vLLM command lines for a topology (TP / DP / EP, dp-attention, MTP, multi-node) and the
              subprocess lifecycle (health wait, log streaming, signal forwarding); launch.py is what
              `glm5 serve --engine sglang|vllm` does
- bench/      `glm5 bench serve`: the load generator (sglang bench_serving semantics) and its report

Life of a request in `glm5 serve`: http app validates and renders -> engine protocol `generate` -> AsyncLLM queue
-> LLMEngine.step (schedule -> run -> postprocess) -> streamed outputs -> GLM-5 parser -> OpenAI chunks.

    from serve import LLM, SamplingParams

The engine (and torch) is imported on first use, so `glm5 bench serve` and the launchers start without it.
"""

from __future__ import annotations

_ENGINE_NAMES = ("LLM", "AsyncLLM", "EngineConfig", "RequestOutput", "SamplingParams")
__all__ = list(_ENGINE_NAMES)


def __getattr__(name: str):
    if name in _ENGINE_NAMES:
        import serve.engine

        return getattr(serve.engine, name)
    raise AttributeError(f"module 'serve' has no attribute {name!r}")
