"""/generate: sglang's native route, token ids only, for RL rollouts.

In: `input_ids`, `sampling_params` (`max_new_tokens`, temperature, top_p, top_k, min_p, stop_token_ids, ignore_eos,
sampling_seed; `json_schema` / `regex` / `ebnf` constrain the output, serve/http/constraints.py; any other key is a
400, as in sglang), `return_logprob`, `top_logprobs_num`, `stream`, `lora_path` (the name of a loaded adapter: one
that is not loaded is a 400, as in sglang; the embedded engine serves the last one loaded, and `weight_version` says
which weights sampled). Out: `output_ids`, `text`, and `meta_info` with the finish
reason, token counts, `output_token_logprobs` as `[logprob, token_id]` pairs, and `weight_version` (the weights
that sampled the last token; `weight_version_first`: the first token's, which differs when an update landed
mid-request), so a trainer can tell which policy produced a rollout (IcePop-style off-policy corrections need it). Streaming sends cumulative
objects, as sglang does.
"""

from __future__ import annotations

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse

from serve.engine.sampling_params import SamplingParams
from serve.http.constraints import generate_constraint
from serve.http.errors import bad_request
from serve.http.generation import Generation
from serve.http.logprobs import finite
from serve.http.protocol import GenerateRequest, parse_body
from serve.http.state import ServerState, new_id
from serve.http.streaming import drain, event_stream, merged, sse
from serve.http.weight_updates import UpdateError, weight_version


def response_body(state: ServerState, gen: Generation, req: GenerateRequest) -> dict:
    res = gen.result
    meta = {
        "id": gen.request_id,
        "finish_reason": {"type": res.finish_reason} if res.finish_reason else None,
        "prompt_tokens": len(gen.prompt_ids),
        "completion_tokens": len(res.token_ids),
        "cached_tokens": res.cached_tokens,
        # sglang's field: the weights that sampled the last token; and those of the first (a push mid-request)
        "weight_version": weight_version(state, res.weights_version),
        "weight_version_first": weight_version(state, res.first_weights_version),
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [[finite(e.logprob), int(e.token_id)] for e in res.logprobs]
        if req.top_logprobs_num:
            meta["output_top_logprobs"] = [
                [[finite(lp), int(t)] for t, lp in sorted((e.top or {}).items(), key=lambda kv: -kv[1])][
                    : req.top_logprobs_num
                ]
                for e in res.logprobs
            ]
    return {"text": res.text, "output_ids": list(res.token_ids), "meta_info": meta}


async def generate(state: ServerState, request: Request):
    req = parse_body(GenerateRequest, await request.body())
    vocab = getattr(state.tokenizer, "vocab_size", None)
    if vocab is not None and any(not 0 <= t < vocab for t in req.input_ids):
        raise bad_request(f"input_ids has ids outside [0, {vocab})", param="input_ids")
    if req.top_logprobs_num > state.settings.max_top_logprobs:
        # The same cap as chat's top_logprobs: each one costs a sort and a JSON entry per token.
        raise bad_request(f"top_logprobs_num is at most {state.settings.max_top_logprobs}", param="top_logprobs_num")
    if req.lora_path is not None:
        up = state.weight_updater
        try:
            if up is None:
                raise UpdateError(f"The following requested LoRA adapters are not loaded: {req.lora_path}\n"
                                  "Loaded adapters: [].")  # fmt: skip
            up.check_loaded(req.lora_path)
        except UpdateError as e:
            raise bad_request(str(e), param="lora_path") from None
    sp = req.sampling_params
    max_tokens = state.max_new_tokens(len(req.input_ids), sp.max_new_tokens, "input_ids", "max_new_tokens")
    want_lp = req.return_logprob
    # In a worker thread: a large schema compiles for seconds, and the event loop must go on serving meanwhile.
    constraint = await anyio.to_thread.run_sync(generate_constraint, state, sp)
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=max(0, sp.top_k),
            min_p=sp.min_p,
            repetition_penalty=sp.repetition_penalty,
            seed=sp.sampling_seed,
            stop_token_ids=tuple(sp.stop_token_ids or ()),
            ignore_eos=sp.ignore_eos,
            logprobs=req.top_logprobs_num if want_lp else None,
            detokenize=False,  # the app decodes (generation.py)
            constraint=constraint,
        )
    except ValueError as e:
        raise bad_request(str(e), param="sampling_params") from None
    ticket = state.admit(1)
    gen = Generation(state, list(req.input_ids), params, (), req.rid or new_id("gen"))
    if not req.stream:
        try:
            await drain(request, [gen])
        finally:
            ticket.release()
        return JSONResponse(response_body(state, gen, req))

    async def events():
        async for _ in merged([gen]):
            yield sse(response_body(state, gen, req))

    return event_stream(events(), ticket)
