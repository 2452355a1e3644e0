"""The OpenAI-compatible HTTP app: a thin shell over any engine that speaks `AsyncEngine`.

Module map:
- engine_protocol.py  `AsyncEngine`: the few things the app needs from an engine (generate / abort / metrics,
                      max_model_len, weights_version), and the output fields it reads.
- settings.py         `ServerSettings`: served model name, API key, queue bound, defaults.
- errors.py           `APIError` and OpenAI-style error bodies; FastAPI's 422s become 400s naming the field.
- protocol.py         pydantic request models with the checks OpenAI / sglang / vLLM make (types, ranges, tools,
                      tool_choice), parsed from raw bytes so bad JSON is a 400 too.
- detokenizer.py      token ids -> text deltas, safe at UTF-8 boundaries, with stop strings held back and cut.
- generation.py       one engine request as a stream of `Step`s (text delta, tokens, logprobs, finish), with the
                      stop-string cut, the abort on cancel, the concurrency bound and the latency metrics.
- logprobs.py         logprobs in the chat and the completions wire formats.
- chat.py             /v1/chat/completions: render (GLM-5 template, tools, tool_choice, thinking), parse
                      reasoning and tool calls (GLM-5's glm45 / glm47 formats), stream or assemble.
- completions.py      /v1/completions.
- tokenize.py         /v1/tokenize and /v1/detokenize.
- native.py           /generate: token ids in; ids, logprobs and the weights' version out (for RL).
- metrics.py          Prometheus text exposition: latency histograms, token counters, engine gauges.
- app.py              `create_app(engine, tokenizer, settings)`: routes, auth, /health (503 until the warm-up
                      generation succeeded), /v1/models, /metrics.
- server.py           `run_embedded(...)`: load a checkpoint with a progress display, then uvicorn.

Life of a chat request: bytes -> protocol.ChatCompletionRequest -> chat.build_prompt (ids) -> n x
generation.run (engine.generate, detokenize, stop strings) -> chat parser deltas -> SSE chunks or one response.
"""
