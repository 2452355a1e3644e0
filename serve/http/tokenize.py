"""/v1/tokenize and /v1/detokenize (vLLM's and sglang's auxiliary routes): what the server would feed the model.

`messages` are rendered with the chat template first, exactly as /v1/chat/completions renders them (thinking on),
so a client can count a conversation's tokens before sending it.
"""

from __future__ import annotations

from fastapi import Request

from serve.http.errors import bad_request
from serve.http.protocol import DetokenizeRequest, TokenizeRequest, parse_body
from serve.http.state import ServerState


async def tokenize(state: ServerState, request: Request) -> dict:
    req = parse_body(TokenizeRequest, await request.body())
    if req.model is not None:
        state.check_model(req.model)
    if req.messages is not None:
        text = state.render_chat(req.messages, None, req.add_generation_prompt, state.settings.enable_thinking)
    else:
        text = req.prompt or ""
    state.check_text_length(text, "messages" if req.messages is not None else "prompt")
    ids = state.tokenizer.encode(text)
    return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}


async def detokenize(state: ServerState, request: Request) -> dict:
    req = parse_body(DetokenizeRequest, await request.body())
    if req.model is not None:
        state.check_model(req.model)
    vocab = getattr(state.tokenizer, "vocab_size", None)
    if vocab is not None and any(not 0 <= t < vocab for t in req.tokens):
        raise bad_request(f"tokens must be ids in [0, {vocab})", param="tokens")
    return {"prompt": state.tokenizer.decode(req.tokens)}
