"""Inference: the embedded engine, the OpenAI-compatible HTTP app, and launchers for sglang / vLLM."""
