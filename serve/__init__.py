"""Inference: the embedded engine, the OpenAI-compatible HTTP app, and launchers for sglang / vLLM.

Module map:
- engine/   the embedded PyTorch engine: `LLM`, `SamplingParams`, `AsyncLLM` (see engine/__init__.py)

    from serve import LLM, SamplingParams
"""

from serve.engine import LLM, AsyncLLM, EngineConfig, RequestOutput, SamplingParams

__all__ = ["LLM", "AsyncLLM", "EngineConfig", "RequestOutput", "SamplingParams"]
