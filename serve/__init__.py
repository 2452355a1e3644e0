"""Inference: the embedded engine, the OpenAI-compatible HTTP app, and launchers for sglang / vLLM.

Module map:
- engine/     the embedded PyTorch engine: `LLM`, `SamplingParams`, `AsyncLLM` (see engine/__init__.py)
- http/       the OpenAI-compatible HTTP app over any `AsyncEngine` (`create_app`, `run_embedded`)
- launchers/  sglang / vLLM command lines for GLM-5 topologies, and their process lifecycle
- bench/      `glm5 bench serve`: the load generator (sglang bench_serving semantics)

    from serve import LLM, SamplingParams
"""

from serve.engine import LLM, AsyncLLM, EngineConfig, RequestOutput, SamplingParams

__all__ = ["LLM", "AsyncLLM", "EngineConfig", "RequestOutput", "SamplingParams"]
