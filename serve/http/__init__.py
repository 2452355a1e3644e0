"""The OpenAI-compatible HTTP app: a thin shell over any engine that speaks `AsyncEngine`.

Module map:
- engine_protocol.py  `AsyncEngine`: the few things the app needs from an engine (generate / abort / metrics,
                      max_model_len, weights_version), and the output fields it reads.
- settings.py         `ServerSettings`: served model name, API key, queue bound, body limit, access log, the
                      checkpoint's own chat template, defaults.
- middleware.py       the request-body size limit (413) and the access log, as plain ASGI wrappers.
- errors.py           `APIError` and OpenAI-style error bodies; FastAPI's 422s become 400s naming the field.
- protocol.py         pydantic request models with the checks OpenAI / sglang / vLLM make (types, ranges, tools,
                      tool_choice), parsed from raw bytes so bad JSON is a 400 too.
- messages.py         the conversation checks OpenAI makes (content required, tool results answer tool calls).
- template.py         the checkpoint's own chat template (jinja2, as apply_chat_template), when it is not GLM-5's.
- constraints.py      tool_choice "required" / a named function and response_format as a grammar for the sampler.
- generation.py       one engine request as a stream of `Step`s (text delta, tokens, logprobs, finish): the ids
                      decoded once, here, by the engine's own text path (serve/engine/detokenizer.py: DecodeStream,
                      stop strings held back and cut), the abort on cancel, the concurrency bound, latency metrics.
- logprobs.py         logprobs in the chat and the completions wire formats.
- chat.py             /v1/chat/completions: render (GLM-5 template, tools, tool_choice, thinking), parse
                      reasoning and tool calls (GLM-5's glm45 / glm47 formats), stream or assemble.
- completions.py      /v1/completions.
- tokenize.py         /v1/tokenize and /v1/detokenize.
- native.py           /generate: token ids in; ids, logprobs and the weights' version out (for RL).
- weight_updates.py   sglang's /update_weights_from_disk, /load_lora_adapter, /unload_lora_adapter (its adapter
                      registry: a name loaded once), /get_weight_version, /update_weight_version: weight pushes
                      between engine steps, each a new weights version.
- pause.py            sglang's /pause_generation (abort | retract | in_place) and /continue_generation: new
                      generations wait while paused, around a weight push.
- metrics.py          Prometheus text exposition: latency histograms, token counters, engine gauges.
- app.py              `create_app(engine, tokenizer, settings)`: routes, auth, /health (503 until the warm-up
                      generation succeeded), /v1/models, /metrics.
- server.py           `run_embedded(...)`: bind the port, check the chat template, load a checkpoint with a
                      progress display (KV cache sized to the model), then uvicorn on the bound socket.

Life of a chat request: bytes (BodyLimit, AccessLog, BearerAuth) -> protocol.ChatCompletionRequest ->
messages.check_messages -> chat.build_prompt (ids; constraints.chat_constraint) -> n x generation.run
(engine.generate; text and stop strings by serve.engine.detokenizer.Detokenizer) -> chat parser deltas -> SSE
chunks or one response.
"""
