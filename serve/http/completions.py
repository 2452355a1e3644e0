"""/v1/completions: raw prompts (text or token ids, one or a batch) in, text completions out.

Choice `index` runs over prompts then samples: prompt p's sample j is choice p * n + j, as in OpenAI. `echo`
puts the prompt's text before the completion. No chat template and no parsing: the text is what the model wrote.
"""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse

from serve.http.errors import bad_request
from serve.http.generation import Generation
from serve.http.logprobs import completion_logprobs
from serve.http.protocol import CompletionRequest, parse_body
from serve.http.state import ServerState, choice_seed, new_id
from serve.http.streaming import chunk_writer, drain, event_stream, merged


def prompt_ids(state: ServerState, prompt: str | list[int], index: int) -> list[int]:
    if isinstance(prompt, str):
        state.check_text_length(prompt, "prompt")
        ids = state.tokenizer.encode(prompt)
    else:
        vocab = getattr(state.tokenizer, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in prompt):
            raise bad_request(f"prompt[{index}] has token ids outside [0, {vocab})", param="prompt")
        ids = list(prompt)
    if not ids:
        raise bad_request("the prompt is empty", param="prompt")
    return ids


async def completions(state: ServerState, request: Request):
    req = parse_body(CompletionRequest, await request.body())
    state.check_model(req.model)
    prompts = req.prompts()
    total = len(prompts) * req.n
    if req.n > state.settings.max_n or total > 4 * state.settings.max_n:
        raise bad_request(f"{len(prompts)} prompts x n={req.n} is too many choices for one request", param="n")
    if req.logprobs is not None and req.logprobs > state.settings.max_top_logprobs:
        raise bad_request(f"logprobs is at most {state.settings.max_top_logprobs}", param="logprobs")
    rid = new_id("cmpl")
    gens, echoes, prompt_lens = [], [], []
    for p_i, prompt in enumerate(prompts):
        ids = prompt_ids(state, prompt, p_i)
        max_tokens = state.max_new_tokens(len(ids), req.max_tokens, "prompt", "max_tokens")
        echo = (prompt if isinstance(prompt, str) else state.tokenizer.decode(ids)) if req.echo else ""
        prompt_lens.append(len(ids))
        for j in range(req.n):
            params = state.sampling_params(req, max_tokens, choice_seed(req.seed, j), req.logprobs)
            gens.append(Generation(state, ids, params, req.stop_strings, f"{rid}-{p_i * req.n + j}"))
            echoes.append(echo)
    ticket = state.admit(len(gens))
    created = int(time.time())
    model = state.settings.served_model_name
    top_n = req.logprobs or 0

    def usage() -> dict:
        done = sum(len(g.result.token_ids) for g in gens)
        prompt_tokens = sum(prompt_lens)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}

    if not req.stream:
        try:
            await drain(request, gens)
        finally:
            ticket.release()
        choices = []
        for i, g in enumerate(gens):
            res = g.result
            choices.append(
                {
                    "index": i,
                    "text": echoes[i] + res.text,
                    "logprobs": completion_logprobs(state.tokenizer, res.logprobs, top_n, len(echoes[i]))
                    if req.logprobs is not None
                    else None,
                    "finish_reason": res.finish_reason,
                    "stop_reason": res.stop_reason,
                }
            )
        return JSONResponse(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage(),
            }
        )

    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    chunk = chunk_writer(rid, created, model, "text_completion", include_usage)

    async def events():
        offsets = [len(e) for e in echoes]
        for i, e in enumerate(echoes):
            if e:
                yield chunk([{"index": i, "text": e, "logprobs": None, "finish_reason": None}])
        async for i, step in merged(gens):
            if not step.text and step.finish_reason is None and not step.logprobs:
                continue
            lp = None
            if req.logprobs is not None:
                lp = completion_logprobs(state.tokenizer, step.logprobs, top_n, offsets[i])
            offsets[i] += len(step.text)
            yield chunk([{"index": i, "text": step.text, "logprobs": lp, "finish_reason": step.finish_reason}])
        if include_usage:
            yield chunk([], usage())

    return event_stream(events(), ticket)
