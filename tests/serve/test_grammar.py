"""Constrained decoding on the real engine (`tiny`, random weights) through the `openai` client: forced tool calls
come back as structured `tool_calls` whose arguments follow the tool's schema, `response_format` gives JSON that
follows the schema, and requests without a grammar decode exactly as they do with none in the batch.

A random-weight model left alone never writes a tool call or JSON, so everything structured below is the grammar's
doing. The schemas are bounded (enums, integer ranges, booleans, short strings) so the grammar ends within the
token budget and the finish reason can be asserted.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import pytest
import torch

pytest.importorskip("xgrammar")

from model.tokenizer import Tokenizer  # noqa: E402
from serve.engine import grammar  # noqa: E402
from serve.engine.sampler import Sampler  # noqa: E402
from serve.engine.sampling_params import SamplingParams  # noqa: E402
from serve.engine.sequence import Sequence  # noqa: E402
from serve.http.app import create_app  # noqa: E402
from serve.http.settings import ServerSettings  # noqa: E402
from tests.serve.conftest import ask  # noqa: E402
from tests.serve.server_thread import ServerThread  # noqa: E402

MODEL = "tiny"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "metric"],
    "additionalProperties": False,
}
SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 12}},
    "required": ["query"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(tiny_engine):
    engine, tok = tiny_engine
    with ServerThread(create_app(engine, tok, ServerSettings(MODEL, max_in_flight=64))) as s:
        s.wait_healthy()
        yield s


def check_calls(calls, names=SCHEMAS):
    assert calls, "no tool calls"
    for c in calls:
        assert c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("text", ["hello", "what is the weather like?", "tell me a story"])
def test_required_gives_one_schema_valid_tool_call(client, text):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask(text),
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=120,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    check_calls(choice.message.tool_calls)


def test_required_with_parallel_calls_never_leaks_markup_as_content(client):
    """With parallel calls allowed a random model may call and call until max_tokens cuts the last call off;
    the finished calls are valid and the cut-off one is not passed off as content."""
    for stream in (False, True):
        kw = dict(model=MODEL, messages=ask("hello"), tools=TOOLS, tool_choice="required", max_tokens=160, seed=1)
        if not stream:
            r = client.chat.completions.create(**kw)
            calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
            assert r.choices[0].message.content is None and finish in ("tool_calls", "length")
            check_calls(calls if finish == "tool_calls" else calls[:-1])  # a call cut off by max_tokens is partial
        else:
            chunks = list(client.chat.completions.create(**kw, stream=True))
            assert not any(c.choices and c.choices[0].delta.content for c in chunks)
            assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


def test_named_function_is_called_once_with_valid_arguments_sampled_and_streamed(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = None
    for seed in range(3):  # sampled at temperature 1: the grammar holds whatever is drawn
        r = client.chat.completions.create(
            model=MODEL, messages=ask("hi"), tools=TOOLS, tool_choice=named, seed=seed, max_tokens=120
        )
        (call,) = r.choices[0].message.tool_calls
        check_calls([call], names={"get_weather"})
        assert r.choices[0].finish_reason == "tool_calls"
        first = first or call
    stream = client.chat.completions.create(
        model=MODEL, messages=ask("hi"), tools=TOOLS, tool_choice=named, seed=0, max_tokens=120, stream=True
    )
    chunks = list(stream)
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather"
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    assert args == json.loads(first.function.arguments)  # the same seed gives the same call, streamed or not
    assert not any(c.choices[0].delta.content for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_response_format_json_schema_and_json_object(client):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=ask("6 x 7?"), response_format=fmt, seed=seed, max_tokens=60, extra_body=NO_THINKING
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("6 x 7?"),
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
        extra_body=NO_THINKING,
    )
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_constrained_neighbours_leave_unconstrained_requests_unchanged(server, client):
    """Greedy requests without a grammar give the same tokens and logprobs alone and in a batch full of
    constrained ones (the grammar's masks never reach an unconstrained row)."""
    body = {"model": MODEL, "messages": ask("count with me"), "temperature": 0, "max_tokens": 24, "logprobs": True}
    forced = {**body, "tools": TOOLS, "tool_choice": "required", "max_tokens": 60}

    def key(r):
        c = r["choices"][0]
        return c["message"]["content"], [t["logprob"] for t in c["logprobs"]["content"]]

    alone = key(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json())

    async def batch():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            rs = await asyncio.gather(*[c.post("/v1/chat/completions", json=b) for b in [forced, body, forced, body]])
        return [r.json() for r in rs]

    rs = asyncio.run(batch())
    for r in (rs[1], rs[3]):
        text, logprobs = key(r)
        # the same tokens; the logprobs to fp32 rounding: whether the four land in one batch or are staggered
        # changes the GEMMs' row counts, and so BLAS's summation order (it failed ~1 in 5 runs as bit-identity)
        assert text == alone[0] and len(logprobs) == len(alone[1])
        assert all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(logprobs, alone[1], strict=True))
    assert rs[0]["choices"][0]["message"]["tool_calls"] and rs[2]["choices"][0]["message"]["tool_calls"]


def test_without_xgrammar_forced_calls_and_json_are_a_400_saying_what_to_install(server, monkeypatch):
    monkeypatch.setattr(grammar, "available", lambda: False)
    state = server.server.config.app.state.glm5
    monkeypatch.setattr(state, "grammars", None)
    for extra in ({"tools": TOOLS, "tool_choice": "required"}, {"response_format": {"type": "json_object"}}):
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": ask("x"), **extra})
        assert r.status_code == 400, r.text
        assert "xgrammar" in r.json()["error"]["message"] and "glm5[grammar]" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": ask("x"), "max_tokens": 2})
    assert r.status_code == 200  # unconstrained requests do not need it


def test_generate_takes_sglangs_json_schema_regex_and_ebnf(server):
    tok = Tokenizer.shipped()
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
    cases = [
        ({"json_schema": json.dumps(schema)}, lambda t: jsonschema.validate(json.loads(t), schema)),
        ({"regex": "(yes|no)-[0-9]{3}"}, lambda t: re.fullmatch("(yes|no)-[0-9]{3}", t) or pytest.fail(t)),
        ({"ebnf": 'root ::= "a" ("b" | "c")* "."'}, lambda t: re.fullmatch("a[bc]*[.]", t) or pytest.fail(t)),
    ]
    for extra, check in cases:
        sp = {"max_new_tokens": 40, "temperature": 0, **extra}
        r = httpx.post(server.url + "/generate", json={"input_ids": tok.encode("x = "), "sampling_params": sp})
        assert r.status_code == 200, r.text
        out = r.json()
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            check(tok.decode([t for t in out["output_ids"] if t not in tok.eos_token_ids]))
        else:  # a random model may stay inside `("b" | "c")*` until max_new_tokens
            assert "ebnf" in extra and re.fullmatch("a[bc]*", out["text"]), out
    bad = {"regex": "(", "json_schema": "{"}
    for k, v in bad.items():
        r = httpx.post(server.url + "/generate", json={"input_ids": [1, 2], "sampling_params": {k: v}})
        assert r.status_code == 400 and f"sampling_params.{k}" in r.json()["error"]["message"], r.text


def test_bad_response_format_is_a_400(server):
    for fmt, word in (({"type": "yaml"}, "response_format.type"), ({"type": "json_schema"}, "json_schema")):
        r = httpx.post(
            server.url + "/v1/chat/completions", json={"model": MODEL, "messages": ask("x"), "response_format": fmt}
        )
        assert r.status_code == 400 and word in r.json()["error"]["message"], r.text


def test_a_schema_xgrammar_cannot_compile_is_a_400_without_our_build_paths(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    body = {"model": MODEL, "messages": ask("x"), "response_format": fmt}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    said = r.json()["error"]["message"]
    assert r.status_code == 400 and 'Unsupported type "nonsense"' in said, r.text
    assert ".cc:" not in said and "/project/" not in said, said


# ---- the grammar and the sampler, without the server ------------------------------------------------------


def accepts(g: grammar.Grammar, tok: Tokenizer, text: str) -> bool:
    """Whether the grammar lets the sampler emit `text`'s tokens one after another."""
    ids, state = tok.encode(text), g.start()
    for k, t in enumerate(ids):
        row = torch.zeros(tok.vocab_size)
        state.mask_(row, ids[:k])
        if row[t] == float("-inf"):
            return False
    return True


def test_grammar_follows_glm5_tool_call_syntax_and_reasoning_then_json():
    tok = Tokenizer.shipped()
    gs = grammar.Grammars(tok)
    calls = gs.compile(gs.tool_call_format(TOOLS, parallel=True), "calls")
    good = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>days</arg_key>"
    good += "<arg_value>3</arg_value><arg_key>metric</arg_key><arg_value>true</arg_value></tool_call>"
    assert accepts(calls, tok, good + "<tool_call>search<arg_key>query</arg_key><arg_value>x y</arg_value></tool_call>")
    assert not accepts(calls, tok, good.replace("Rome", "Lima"))  # not in the enum
    assert not accepts(calls, tok, good.replace(">3<", ">9<"))  # past the maximum
    assert not accepts(calls, tok, "Sure! " + good)  # no text before the call
    assert not accepts(calls, tok, good.replace("</arg_key><arg_value>", "</arg_key> <arg_value>"))  # no padding
    one = gs.compile(gs.tool_call_format(TOOLS, parallel=False), "one call")
    assert accepts(one, tok, good) and not accepts(one, tok, good + "<tool_call>")
    js = gs.compile(
        gs.after_reasoning(gs.json_format({"type": "object", "properties": {"a": {"type": "boolean"}}})), "j"
    )
    assert accepts(js, tok, 'let me think</think>{"a":true}') and not accepts(js, tok, "let me think</think>hi")
    # after the grammar's end only an end-of-turn token may follow
    ids = tok.encode(good)
    row = torch.zeros(tok.vocab_size)
    one.start().mask_(row, ids)
    assert set(torch.nonzero(row == 0).flatten().tolist()) == set(tok.eos_token_ids)


def test_sampler_rows_without_a_grammar_are_untouched():
    tok = Tokenizer.shipped()
    gs = grammar.Grammars(tok)
    g = gs.compile(gs.json_format(None), "json")
    torch.manual_seed(0)
    logits = torch.randn(3, tok.vocab_size)
    plain = [Sequence(f"p{i}", [1, 2, 3], SamplingParams(temperature=0.7, seed=i, logprobs=3)) for i in range(2)]
    alone = Sampler()(logits[:2].clone(), plain)
    plain2 = [Sequence(f"q{i}", [1, 2, 3], SamplingParams(temperature=0.7, seed=i, logprobs=3)) for i in range(2)]
    mixed_seqs = [plain2[0], Sequence("c", [1, 2, 3], SamplingParams(temperature=0.7, constraint=g)), plain2[1]]
    mixed = Sampler()(logits[[0, 2, 1]].clone(), mixed_seqs)
    assert [mixed[0], mixed[2]] == alone
    assert tok.decode([mixed[1].token_id]).lstrip().startswith("{")


def test_the_grammar_cache_keeps_only_the_most_recently_used_grammars_and_they_stay_right():
    tok = Tokenizer.shipped()
    gs = grammar.Grammars(tok, cache_size=4)
    schemas = [
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]} for i in range(7)
    ]
    compiled = [gs.compile(gs.json_format(s), f"schema {i}") for i, s in enumerate(schemas)]
    assert len(gs._cache) == 4
    for i, g in enumerate(compiled):
        assert accepts(g, tok, f'{{"k{i}":{i}}}') and not accepts(g, tok, f'{{"k{(i + 1) % 7}":1}}')
    assert gs.compile(gs.json_format(schemas[6]), "again") is compiled[6]  # recent: cached
    again = gs.compile(gs.json_format(schemas[0]), "again")  # evicted: compiled anew, and still right
    assert again is not compiled[0] and accepts(again, tok, '{"k0":0}') and len(gs._cache) == 4


def test_a_slow_grammar_compiles_off_the_event_loop_while_other_requests_are_served(server, monkeypatch):
    import time

    for method in ("compile", "regex"):
        real = getattr(grammar.Grammars, method)

        def slow(self, *a, _real=real, **kw):
            time.sleep(1.5)  # a large schema compiling (xgrammar releases the GIL, as sleep does)
            return _real(self, *a, **kw)

        monkeypatch.setattr(grammar.Grammars, method, slow)
    chat = {"model": MODEL, "messages": ask("x"), "max_tokens": 2, "response_format": {"type": "json_object"}}
    native = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "regex": "[ab]+"}}

    async def main(path, body):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            slow_request = asyncio.create_task(c.post(path, json=body))
            await asyncio.sleep(0.3)  # it is compiling now
            t0 = time.monotonic()
            health = await c.get("/health")
            waited = time.monotonic() - t0
            return health, waited, slow_request.done(), await slow_request

    for path, body in (("/v1/chat/completions", chat), ("/generate", native)):
        health, waited, done_before, r = asyncio.run(main(path, body))
        assert health.status_code == 200 and waited < 0.5 and not done_before, (path, waited)
        assert r.status_code == 200, r.text


def test_a_grammar_source_past_256_kb_is_a_400(server):
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(12000)}}
    r = httpx.post(
        server.url + "/generate", json={"input_ids": [1], "sampling_params": {"json_schema": json.dumps(big)}}
    )
    assert r.status_code == 400 and "limited to 262144 characters" in r.json()["error"]["message"], r.text
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": big}}
    body = {"model": MODEL, "messages": ask("x"), "response_format": fmt}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and "response_format is" in r.json()["error"]["message"], r.text
