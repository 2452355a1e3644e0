"""/v1/chat/completions: GLM-5's chat format in, OpenAI chat completions out (whole or streamed).

Prompt. Messages and tools are rendered with GLM-5's template (model/chat.py), or the checkpoint's own when it
differs (serve/http/template.py); `chat_template_kwargs`
`enable_thinking` (default on) and `clear_thinking` pass through. `tool_choice`:
- "auto" (the default with tools): the model decides; its `<tool_call>` blocks become `tool_calls`.
- "none": the tools are left out of the prompt and nothing is parsed as a call (vLLM's behaviour with
  `--exclude-tools-when-tool-choice-none`).
- `parallel_tool_calls: false` keeps only the first call.
- "required" / a named function: thinking is closed (`</think>`) and the output is constrained by a grammar
  (serve/http/constraints.py) to GLM-5 tool calls whose arguments follow the tool's schema, so the client always
  gets `tool_calls`, never the raw markup.
`response_format` json_object / json_schema constrains the content (after any reasoning) to JSON / the schema.

`reasoning_effort`: "none" turns thinking off (OpenAI's meaning); the other levels leave it on (GLM-5's template
has no budget knob; its `max` / `high` differ only in the serving stack's thinking budget, which we do not cap).

Parsing. GLM-5's output goes through `model.chat_parse.StreamParser` (the `glm45` reasoning and `glm47` tool-call
formats): reasoning comes out as `reasoning_content`, calls as OpenAI tool-call deltas (id and name first, then
argument fragments), and a turn that called tools finishes with "tool_calls" instead of "stop".

Streaming follows sglang's order per choice: a first chunk with `role: assistant, content: ""`, then deltas, then
an empty delta carrying `finish_reason`; with `stream_options.include_usage`, a last chunk with `choices: []` and
the usage; then `[DONE]`. Logprobs ride on the chunk that carries their text (or the final one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse

from model.chat_parse import StreamParser, accumulate
from serve.http.constraints import chat_constraint, forces_tool_call
from serve.http.errors import bad_request
from serve.http.generation import Generation, Result
from serve.http.logprobs import chat_logprobs
from serve.http.messages import check_messages
from serve.http.protocol import ChatCompletionRequest, parse_body
from serve.http.state import ServerState, choice_seed, new_id
from serve.http.streaming import chunk_writer, drain, event_stream, merged


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    thinking: bool  # the generation prompt opened a think block
    parser_tools: list[dict] | None  # tools the parser accepts as calls ([] = none: calls stay text)
    constraint: Any = None  # the grammar the output must follow (serve/engine/grammar.Grammar), or None
    calls_only: bool = False  # a forced call: the grammar allows no text, so text is a call cut off by max_tokens


async def build_prompt(state: ServerState, req: ChatCompletionRequest) -> ChatPrompt:
    kwargs = req.chat_template_kwargs
    thinking = state.settings.enable_thinking
    if req.reasoning_effort == "none":
        thinking = False  # OpenAI's "no reasoning"; GLM-5's own levels (max, high) all think
    if kwargs and kwargs.enable_thinking is not None:
        thinking = kwargs.enable_thinking
    clear = True if not kwargs or kwargs.clear_thinking is None else kwargs.clear_thinking
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice or ("auto" if tools else "none")
    if choice == "none":
        template_tools, parser_tools = None, []
    else:
        template_tools, parser_tools = tools, tools
        if forces_tool_call(req):
            thinking = False
    text = state.render_chat(req.messages, template_tools, True, thinking, clear)
    state.check_text_length(text, "messages")
    # In a worker thread: a large schema compiles for seconds, and the event loop must go on serving meanwhile.
    constraint = await anyio.to_thread.run_sync(chat_constraint, state, req, parser_tools, thinking)
    return ChatPrompt(state.tokenizer.encode(text), thinking, parser_tools, constraint, forces_tool_call(req))


def reasoning_tokens(state: ServerState, result: Result, thinking: bool) -> int:
    """Generated tokens up to and including `</think>` (all of them if the think block never closed)."""
    if not thinking:
        return 0
    end = state.tokenizer.token_to_id("</think>") if hasattr(state.tokenizer, "token_to_id") else None
    ids = result.token_ids
    return ids.index(end) + 1 if end in ids else len(ids)


def usage(state: ServerState, prompt_len: int, results: list[Result], thinking: bool) -> dict:
    completion = sum(len(r.token_ids) for r in results)
    return {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
        "prompt_tokens_details": {"cached_tokens": max((r.cached_tokens for r in results), default=0)},
        "completion_tokens_details": {"reasoning_tokens": sum(reasoning_tokens(state, r, thinking) for r in results)},
    }


def finish_reason(reason: str | None, called_tools: bool) -> str:
    if reason == "stop" and called_tools:
        return "tool_calls"
    return reason or "stop"


def _first_call_only(delta: dict) -> dict | None:
    """`parallel_tool_calls: false`: drop every call after the first (None when nothing is left to send)."""
    if "tool_calls" not in delta:
        return delta
    calls = [c for c in delta["tool_calls"] if c["index"] == 0]
    return {**delta, "tool_calls": calls} if calls else None


def _calls_only(delta: dict) -> dict | None:
    """A forced call's output: only tool-call deltas (the text of a call cut off mid-name is not content)."""
    return delta if "tool_calls" in delta else None


def _merge_reasoning(delta: dict, separate: bool) -> dict:
    if separate or "reasoning_content" not in delta:
        return delta
    return {"content": delta["reasoning_content"]}


def _filtered(deltas: list[dict], req: ChatCompletionRequest, prompt: ChatPrompt) -> list[dict]:
    """The parser's deltas less what the request leaves out (calls after the first; a forced call's text)."""
    if req.parallel_tool_calls is False:
        deltas = [d for d in map(_first_call_only, deltas) if d is not None]
    if prompt.calls_only:
        deltas = [d for d in map(_calls_only, deltas) if d is not None]
    return deltas


@dataclass
class _Chat:
    """One chat request on its way out: the checked request, its prompt, its n generations and the ids it answers
    with."""

    state: ServerState
    req: ChatCompletionRequest
    prompt: ChatPrompt
    gens: list[Generation]
    rid: str
    created: int

    @property
    def top_n(self) -> int:
        return self.req.top_logprobs or 0

    @property
    def model(self) -> str:
        return self.state.settings.served_model_name

    def logprobs(self, lps: list):
        return chat_logprobs(self.state.tokenizer, lps, self.top_n) if self.req.logprobs else None

    def usage(self) -> dict:
        return usage(self.state, len(self.prompt.ids), [g.result for g in self.gens], self.prompt.thinking)


async def chat_completions(state: ServerState, request: Request):
    req = parse_body(ChatCompletionRequest, await request.body())
    _check_request(state, req)
    prompt = await build_prompt(state, req)
    limit_param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    max_tokens = state.max_new_tokens(len(prompt.ids), req.completion_limit, "messages", limit_param)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = [
        state.sampling_params(req, max_tokens, choice_seed(req.seed, i), logprobs, prompt.constraint)
        for i in range(req.n)
    ]
    ticket = state.admit(req.n)
    rid = new_id("chatcmpl")
    gens = [Generation(state, prompt.ids, p, req.stop_strings, f"{rid}-{i}") for i, p in enumerate(params)]
    chat = _Chat(state, req, prompt, gens, rid, int(time.time()))
    if not req.stream:
        try:
            await drain(request, gens)
        finally:
            ticket.release()
        return JSONResponse(_completion_body(chat))
    return event_stream(_events(chat), ticket)


def _check_request(state: ServerState, req: ChatCompletionRequest) -> None:
    state.check_model(req.model)
    if req.n > state.settings.max_n:
        raise bad_request(f"n is {req.n}; at most {state.settings.max_n}", param="n")
    if req.top_logprobs is not None and req.top_logprobs > state.settings.max_top_logprobs:
        raise bad_request(f"top_logprobs is at most {state.settings.max_top_logprobs}", param="top_logprobs")
    check_messages(req.messages)


def _completion_body(chat: _Chat) -> dict:
    """The whole `chat.completion` response, once every generation has finished."""
    req = chat.req
    body = {
        "id": chat.rid,
        "object": "chat.completion",
        "created": chat.created,
        "model": chat.model,
        "choices": [_choice(chat, i, g.result) for i, g in enumerate(chat.gens)],
        "usage": chat.usage(),
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = list(chat.prompt.ids)
    return body


def _choice(chat: _Chat, i: int, res: Result) -> dict:
    """One finished choice: its text parsed into content, reasoning and tool calls."""
    req = chat.req
    parser = StreamParser(chat.prompt.parser_tools, chat.prompt.thinking)
    deltas = _filtered(parser.feed(res.text) + parser.finish(), req, chat.prompt)
    msg = accumulate(deltas).to_message()
    if not req.separate_reasoning and msg.get("reasoning_content"):
        msg["content"] = msg.pop("reasoning_content") + (msg["content"] or "")
    choice = {
        "index": i,
        "message": msg,
        "finish_reason": finish_reason(res.finish_reason, parser.has_tool_calls),
    }
    choice["logprobs"] = chat.logprobs(res.logprobs)
    if res.stop_reason is not None:
        choice["stop_reason"] = res.stop_reason
    if req.return_token_ids:
        choice["token_ids"] = list(res.token_ids)
    return choice


async def _events(chat: _Chat):
    """The SSE chunks of a streamed chat: each choice's first chunk, its deltas as they come, its finish; then
    the usage when asked."""
    req, prompt, gens = chat.req, chat.prompt, chat.gens
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    chunk = chunk_writer(chat.rid, chat.created, chat.model, "chat.completion.chunk", include_usage)
    parsers = [StreamParser(prompt.parser_tools, prompt.thinking) for _ in gens]
    pending_lps: list[list] = [[] for _ in gens]
    pending_ids: list[list[int]] = [[] for _ in gens]  # sampled ids not yet sent (return_token_ids)

    def with_ids(choice: dict, i: int) -> dict:
        # The ids ride on the chunk that follows their sampling, as vLLM sends them; the last chunk sends the rest.
        if req.return_token_ids:
            choice["token_ids"], pending_ids[i] = pending_ids[i], []
        return choice

    for i in range(len(gens)):
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        if req.return_token_ids:
            first["prompt_token_ids"] = list(prompt.ids)
        yield chunk([first])
    async for i, step in merged(gens):
        parser = parsers[i]
        pending_lps[i] += step.logprobs
        pending_ids[i] += step.token_ids
        deltas = parser.feed(step.text) if step.text else []
        if step.finish_reason is not None:
            deltas += parser.finish()
        for d in _filtered(deltas, req, prompt):
            lp = None
            if req.logprobs and pending_lps[i]:
                lp, pending_lps[i] = chat.logprobs(pending_lps[i]), []
            delta = {"index": i, "delta": _merge_reasoning(d, req.separate_reasoning), "logprobs": lp}
            yield chunk([with_ids({**delta, "finish_reason": None}, i)])
        if step.finish_reason is not None:
            lp, pending_lps[i] = chat.logprobs(pending_lps[i]), []
            final = {
                "index": i,
                "delta": {},
                "logprobs": lp,
                "finish_reason": finish_reason(step.finish_reason, parser.has_tool_calls),
            }
            if gens[i].result.stop_reason is not None:
                final["stop_reason"] = gens[i].result.stop_reason
            yield chunk([with_ids(final, i)])
    if include_usage:
        yield chunk([], chat.usage())
