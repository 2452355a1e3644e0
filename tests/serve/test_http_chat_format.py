"""GLM-5's chat format through the HTTP app, driven by the official `openai` client over a real uvicorn server:
reasoning split, thinking on/off, tool calls (whole and streamed), tool_choice, n, stop strings, logprobs.

A random-weight model never writes a tool call, so here the scripted engine chooses what the "model" writes;
everything else (engine numerics, batching, KV blocks) is tested against the real engine in test_http_embedded.py.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from model.tokenizer import Tokenizer
from serve.http.app import create_app
from serve.http.settings import ServerSettings
from tests.serve.conftest import ask
from tests.serve.scripted_engine import ScriptedEngine
from tests.serve.server_thread import ServerThread

MODEL = "glm-5-test"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
CALL = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
    "<arg_value>3</arg_value></tool_call>"
)


def script(tok):
    """What the scripted model writes, chosen by the prompt's text."""

    def write(prompt_ids, params):
        prompt = tok.decode(prompt_ids)
        if params.constraint is not None:  # a forced call: write what the grammar allows (checked in test_grammar)
            return "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"
        last_user = prompt.rsplit("<|user|>", 1)[-1]
        if "weather" in last_user:
            return "The user wants weather.</think>Let me check." + CALL
        if "stop" in last_user:
            return "One two. STOP three four"
        if "long" in last_user:
            return " ".join(["word"] * 200)
        if prompt.endswith("<think>"):
            return "Six times seven.</think>The answer is 42."
        return "The answer is 42."

    return write


@pytest.fixture(scope="module")
def server():
    tok = Tokenizer.shipped()
    engine = ScriptedEngine(tok, script(tok), max_model_len=512)
    with ServerThread(create_app(engine, tok, ServerSettings(MODEL))) as s:
        s.wait_healthy()
        s.engine, s.tok = engine, tok
        yield s


def last_prompt(server) -> str:
    return server.tok.decode(server.engine.seen[-1][0])


def test_chat_splits_reasoning_and_counts_usage(client, server):
    r = client.chat.completions.create(model=MODEL, messages=ask("what is 6 x 7?"))
    msg = r.choices[0].message
    assert msg.content == "The answer is 42." and msg.model_extra["reasoning_content"] == "Six times seven."
    assert r.choices[0].finish_reason == "stop" and r.object == "chat.completion" and r.model == MODEL
    assert r.usage.prompt_tokens == len(server.engine.seen[-1][0])
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens
    assert last_prompt(server).endswith("<|assistant|><think>")


def test_thinking_off_through_chat_template_kwargs(client, server):
    r = client.chat.completions.create(
        model=MODEL, messages=ask("what is 6 x 7?"), extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert last_prompt(server).endswith("<|assistant|></think>")
    assert r.choices[0].message.content == "The answer is 42."
    assert r.choices[0].message.model_extra.get("reasoning_content") is None
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_tool_call_non_streaming(client, server):
    r = client.chat.completions.create(model=MODEL, messages=ask("weather in Paris?"), tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert "# Tools" in last_prompt(server) and '"name": "get_weather"' in last_prompt(server)


def test_tool_call_streaming_deltas(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ask("weather in Paris?"),
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content == ""
    tool_deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert tool_deltas[0].id and tool_deltas[0].function.name == "get_weather"  # id and name first
    assert all(td.id is None and not td.function.name for td in tool_deltas[1:])  # then argument fragments
    assert len(tool_deltas) > 2
    args = "".join(td.function.arguments or "" for td in tool_deltas)
    assert json.loads(args) == {"city": "Paris", "days": 3}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "The user wants weather." and content == "Let me check."
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0  # usage last
    assert all(c.usage is None for c in chunks[:-1])


def test_tool_choice_none_keeps_calls_as_text(client, server):
    r = client.chat.completions.create(model=MODEL, messages=ask("weather in Paris?"), tools=TOOLS, tool_choice="none")
    assert "# Tools" not in last_prompt(server)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert "<tool_call>get_weather" in r.choices[0].message.content


def test_tool_choice_named_and_required_force_a_call(client, server):
    """A forced call closes thinking and hands the engine a grammar of calls to the tools (what the grammar makes
    the real engine write is tested in test_grammar.py); the client gets tool_calls, whole and streamed."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=MODEL, messages=ask("hi"), tools=TOOLS, tool_choice=named)
    assert last_prompt(server).endswith("<|assistant|></think>")
    assert "get_weather" in server.engine.seen[-1][1].constraint.description
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Rome"}
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    stream = client.chat.completions.create(
        model=MODEL, messages=ask("hi"), tools=TOOLS, tool_choice="required", stream=True
    )
    deltas = [tc for c in stream for tc in (c.choices[0].delta.tool_calls or [])]
    assert last_prompt(server).endswith("<|assistant|></think>") and server.engine.seen[-1][1].constraint
    assert deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Rome"}


def test_n_choices_stream_and_not(client):
    r = client.chat.completions.create(model=MODEL, messages=ask("what is 6 x 7?"), n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == "The answer is 42." for c in r.choices)
    text = {0: "", 1: ""}
    for c in client.chat.completions.create(model=MODEL, messages=ask("x"), n=2, stream=True):
        for ch in c.choices:
            text[ch.index] += ch.delta.content or ""
    assert text == {0: "The answer is 42.", 1: "The answer is 42."}


def test_seed_and_sampling_reach_the_engine(client, server):
    client.chat.completions.create(
        model=MODEL, messages=ask("x"), n=2, seed=11, temperature=0.5, top_p=0.9, extra_body={"top_k": 5}
    )
    params = [p for _, p in server.engine.seen[-2:]]
    assert sorted(p.seed for p in params) == [11, 12]
    assert all(p.temperature == 0.5 and p.top_p == 0.9 and p.top_k == 5 for p in params)


def test_logprobs_and_top_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=ask("x"), logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob for e in content)
    assert content[0].logprob == -0.125 and content[1].logprob == -0.375
    streamed = [
        e
        for c in client.chat.completions.create(model=MODEL, messages=ask("x"), logprobs=True, stream=True)
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.logprob for e in streamed] == [e.logprob for e in content]


def test_stop_strings_stream_and_not(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("please stop"),
        stop=["STOP"],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].message.content == "One two." and r.choices[0].finish_reason == "stop"
    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=MODEL,
            messages=ask("please stop"),
            stop="STOP",
            stream=True,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        if c.choices
    ]
    assert "".join(pieces) == "One two." and not any("ST" in p for p in pieces)


def test_parallel_tool_calls_false_keeps_the_first(server, client):
    engine = server.engine
    original = engine.script
    engine.script = lambda ids, params: CALL + CALL.replace("Paris", "Lima")
    try:
        both = client.chat.completions.create(model=MODEL, messages=ask("x"), tools=TOOLS)
        assert [json.loads(c.function.arguments)["city"] for c in both.choices[0].message.tool_calls] == [
            "Paris",
            "Lima",
        ]
        one = client.chat.completions.create(model=MODEL, messages=ask("x"), tools=TOOLS, parallel_tool_calls=False)
        assert [json.loads(c.function.arguments)["city"] for c in one.choices[0].message.tool_calls] == ["Paris"]
        streamed = [
            tc
            for c in client.chat.completions.create(
                model=MODEL, messages=ask("x"), tools=TOOLS, parallel_tool_calls=False, stream=True
            )
            for tc in (c.choices[0].delta.tool_calls or [])
        ]
        assert {tc.index for tc in streamed} == {0}
    finally:
        engine.script = original


def test_reasoning_effort_none_turns_thinking_off(client, server):
    r = client.chat.completions.create(model=MODEL, messages=ask("what is 6 x 7?"), reasoning_effort="none")
    assert last_prompt(server).endswith("<|assistant|></think>") and r.choices[0].message.content == "The answer is 42."
    client.chat.completions.create(model=MODEL, messages=ask("x"), extra_body={"reasoning_effort": "max"})
    assert last_prompt(server).endswith("<|assistant|><think>")
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(model=MODEL, messages=ask("x"), extra_body={"reasoning_effort": "extreme"})


def test_tokenize_and_detokenize(server):
    msgs = ask("what is 6 x 7?")
    r = httpx.post(server.url + "/v1/tokenize", json={"model": MODEL, "messages": msgs}).json()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    usage = client.chat.completions.create(model=MODEL, messages=msgs).usage
    assert r["count"] == len(r["tokens"]) == usage.prompt_tokens and r["max_model_len"] == 512
    back = httpx.post(server.url + "/v1/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"].startswith("[gMASK]<sop>") and back["prompt"].endswith("<|assistant|><think>")
    plain = httpx.post(server.url + "/v1/tokenize", json={"prompt": "hello"}).json()
    assert plain["tokens"] == server.tok.encode("hello")
    bad = httpx.post(server.url + "/v1/tokenize", json={"prompt": "a", "messages": msgs})
    assert bad.status_code == 400 and "exactly one" in bad.json()["error"]["message"]
    assert httpx.post(server.url + "/v1/detokenize", json={"tokens": [-1]}).status_code == 400


def test_engine_counters_and_speculative_acceptance_in_metrics(server):
    from serve.http.metrics import ServerMetrics

    text = ServerMetrics("m").render({"num_preemptions": 3, "spec_draft_tokens": 40, "spec_accepted_tokens": 30}, 0)
    assert 'glm5:num_preemptions_total{model_name="m"} 3' in text
    assert "# TYPE glm5:spec_draft_tokens_total counter" in text
    assert 'glm5:spec_accept_rate{model_name="m"} 0.75' in text
    from prometheus_client.parser import text_string_to_metric_families

    names = {f.name for f in text_string_to_metric_families(text)}  # the text parses as Prometheus exposition
    quoted = ServerMetrics('a "b"\\c').render({}, 0)  # a model name that needs escaping in a label
    (ttft,) = [f for f in text_string_to_metric_families(quoted) if f.name == "glm5:time_to_first_token_seconds"]
    assert ttft.samples[0].labels["model_name"] == 'a "b"\\c'
    assert {"glm5:num_preemptions", "glm5:time_to_first_token_seconds", "glm5:requests_in_flight"} <= names
