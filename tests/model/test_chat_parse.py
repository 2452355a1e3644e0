"""model/chat_parse.py reads GLM-5 completions back into OpenAI messages, whole or streamed in any pieces."""

from __future__ import annotations

import json
import random

import pytest

from model.chat import reasoning_and_content, render_completion, tool_call_function
from model.chat_parse import StreamParser, accumulate, parse
from tests.model.chat_corpus import CORPUS, EDIT, SHELL, WEATHER, assistant_messages

ASSISTANTS = assistant_messages()
IDS = [f"{n}-{i}" for n, i, _, _ in ASSISTANTS]


def expected(msg: dict, thinking: bool = True):
    reasoning, content = reasoning_and_content(msg, 0)
    calls = [tool_call_function(c, 0, j) for j, c in enumerate(msg.get("tool_calls") or [])]
    return ((reasoning.strip() or None) if thinking else None, content.strip() or None, calls)


def summary(p):
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in p.tool_calls]
    return (p.reasoning_content, p.content, calls)


def shape(p):
    """The parse result without the (random) call ids."""
    return (p.reasoning_content, p.content, [(c["type"], c["function"]) for c in p.tool_calls])


def end_tag(conv: str, i: int) -> str:
    msgs = next(m for n, m, _ in CORPUS if n == conv)
    nxt = msgs[i + 1]["role"] if i + 1 < len(msgs) else None
    return {"user": "<|user|>", "tool": "<|observation|>"}.get(nxt, "<|endoftext|>")


@pytest.mark.parametrize(("conv", "i", "msg", "tools"), ASSISTANTS, ids=IDS)
def test_parse_inverts_render(conv, i, msg, tools):
    text = render_completion(msg) + end_tag(conv, i)
    assert summary(parse(text, tools=tools)) == expected(msg)
    text_off = render_completion(msg, enable_thinking=False)
    assert summary(parse(text_off, tools=tools, thinking=False)) == expected(msg, thinking=False)


@pytest.mark.parametrize(("conv", "i", "msg", "tools"), ASSISTANTS, ids=IDS)
def test_stream_matches_parse_at_every_split_point(conv, i, msg, tools):
    text = render_completion(msg) + end_tag(conv, i)
    whole = shape(parse(text, tools=tools))
    for k in range(len(text) + 1):
        p = StreamParser(tools=tools)
        assert shape(accumulate(p.feed(text[:k]) + p.feed(text[k:]) + p.finish())) == whole, k
    p = StreamParser(tools=tools)
    deltas = [d for ch in text for d in p.feed(ch)] + p.finish()
    assert shape(accumulate(deltas)) == whole
    check_delta_order(deltas)


def check_delta_order(deltas):
    """Reasoning first; each call announced (id, type, name, empty arguments) before its argument fragments;
    calls numbered from 0 in order; no empty deltas."""
    seen_other = False
    announced = []
    for d in deltas:
        assert len(d) == 1
        if "reasoning_content" in d:
            assert not seen_other and d["reasoning_content"]
            continue
        seen_other = True
        if "content" in d:
            assert d["content"]
            continue
        (tc,) = d["tool_calls"]
        if "id" in tc:
            assert tc["index"] == len(announced) and tc["type"] == "function" and tc["function"]["arguments"] == ""
            assert tc["id"].startswith("call_") and tc["function"]["name"]
            announced.append(tc["index"])
        else:
            assert tc["index"] in announced and tc["function"]["arguments"] and "name" not in tc["function"]


def test_golden_two_calls_as_sglang_documents_them():
    text = (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京</arg_value><arg_key>date</arg_key>"
        "<arg_value>2024-06-27</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>上海</arg_value><arg_key>date</arg_key><arg_value>2024-06-27</arg_value></tool_call>"
    )
    p = parse(text, thinking=False)
    assert p.content is None and p.reasoning_content is None
    assert [json.loads(c["function"]["arguments"]) for c in p.tool_calls] == [
        {"city": "北京", "date": "2024-06-27"},
        {"city": "上海", "date": "2024-06-27"},
    ]
    assert p.tool_calls[0]["id"] != p.tool_calls[1]["id"]
    assert p.to_message() == {"role": "assistant", "content": None, "tool_calls": p.tool_calls}


def test_glm45_newlines_between_tags_are_tolerated():
    text = "</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>"
    assert summary(parse(text)) == (None, None, [("get_weather", {"city": "Beijing"})])


def test_arguments_are_the_json_dump_of_the_decoded_values():
    text = '<tool_call>f<arg_key>a</arg_key><arg_value>1.50</arg_value><arg_key>b</arg_key><arg_value>{"x":[1,2]}</arg_value></tool_call>'
    (c,) = parse(text, thinking=False).tool_calls
    assert c["function"]["arguments"] == '{"a": 1.5, "b": {"x": [1, 2]}}'


@pytest.mark.parametrize(
    ("text", "thinking", "want"),
    [
        ("still thinking", True, ("still thinking", None, [])),
        ("<think>x</think>y", True, ("x", "y", [])),
        ("</think>answer", True, (None, "answer", [])),
        ("Hello", False, (None, "Hello", [])),
        ("<think>r</think> c ", False, ("r", "c", [])),
        ("plan<tool_call>ls</tool_call>", True, ("plan", None, [("ls", {})])),
        ("</think>done<|user|>ignored <tool_call>x</tool_call>", True, (None, "done", [])),
        (
            "</think>A <tool_call>ls</tool_call>\n B <tool_call>pwd</tool_call> ",
            True,
            (None, "A \n B", [("ls", {}), ("pwd", {})]),
        ),
        ("</think>a</tool_call>b<think>c", True, (None, "a</tool_call>b<think>c", [])),
        (
            "</think><tool_call>f<arg_key>v</arg_key><arg_value>{not json</arg_value></tool_call>",
            True,
            (None, None, [("f", {"v": "{not json"})]),
        ),
        (
            "</think><tool_call>f<arg_key>v</arg_key><arg_value>NaN</arg_value></tool_call>",
            True,
            (None, None, [("f", {"v": "NaN"})]),
        ),
        (
            "</think><tool_call>f<arg_key> k </arg_key>junk<arg_value> v </arg_value>junk</tool_call>",
            True,
            (None, None, [("f", {"k": " v "})]),
        ),
        ("</think><tool_call>f<arg_key>a</arg_key><arg_value>ls -l", True, (None, None, [("f", {"a": "ls -l"})])),
        (
            "</think><tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>par",
            True,
            (None, None, [("f", {"a": 1})]),
        ),
        ("</think><tool_call>f<arg_key>a</arg_key>", True, (None, None, [("f", {})])),
        ("</think><tool_call>get_wea", True, (None, None, [("get_wea", {})])),
        (
            "</think><tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>ok",
            True,
            (None, "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>ok", []),
        ),
        ("</think><tool_call>f<arg_key>a</arg_key><arg_value>1</tool_call>", True, (None, None, [("f", {"a": 1})])),
    ],
)
def test_defined_results(text, thinking, want):
    assert summary(parse(text, thinking=thinking)) == want
    p = StreamParser(thinking=thinking)
    assert summary(accumulate([d for ch in text for d in p.feed(ch)] + p.finish())) == want


def test_unknown_tool_is_kept_as_content_when_tools_are_declared():
    raw = "<tool_call>rm_rf<arg_key>path</arg_key><arg_value>/</arg_value></tool_call>"
    p = parse("</think>I will." + raw, tools=[SHELL])
    assert p.tool_calls == [] and p.content == "I will." + raw
    p = parse("</think><tool_call>get_wea", tools=[WEATHER])
    assert p.tool_calls == [] and p.content == "<tool_call>get_wea"
    assert [c["function"]["name"] for c in parse("</think>" + raw).tool_calls] == ["rm_rf"]  # no tools: any name


def test_schema_string_values_stay_strings_and_stream_as_written():
    text = '</think><tool_call>edit_file<arg_key>path</arg_key><arg_value>42</arg_value><arg_key>old</arg_key><arg_value>  "x"\n</arg_value></tool_call>'
    assert summary(parse(text, tools=[EDIT]))[2] == [("edit_file", {"path": "42", "old": '  "x"\n'})]
    assert summary(parse(text))[2] == [("edit_file", {"path": 42, "old": "x"})]  # untyped: JSON where it parses
    p = StreamParser(tools=[EDIT])
    frags = [d["tool_calls"][0]["function"]["arguments"] for ch in text for d in p.feed(ch) if "tool_calls" in d]
    assert len(frags) > 8  # the string values arrived piece by piece, not in one go at the end


def test_stop_tag_ends_an_open_call():
    p = parse("</think><tool_call>f<arg_key>a</arg_key><arg_value>x<|observation|>more", tools=None)
    assert summary(p) == (None, None, [("f", {"a": "x"})])


PIECES = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|user|>",
    "<|observation|>",
    "get_weather",
    "city",
    "days",
    "abc",
    " ",
    "\n",
    '{"a": [1, 2]}',
    "7",
    "北京",
    "<",
    "</",
    "<arg",
    "|>",
    "\\",
    '"',
    "true",
    "",
]


def test_random_garbage_never_raises_and_streams_like_parse():
    rng = random.Random(1234)
    for _ in range(400):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        for tools in (None, [WEATHER]):
            for thinking in (True, False):
                whole = parse(text, tools=tools, thinking=thinking)
                for c in whole.tool_calls:
                    assert isinstance(json.loads(c["function"]["arguments"]), dict)
                cuts = sorted(rng.sample(range(len(text) + 1), min(3, len(text) + 1)))
                p = StreamParser(tools=tools, thinking=thinking)
                deltas, prev = [], 0
                for cut in [*cuts, len(text)]:
                    deltas += p.feed(text[prev:cut])
                    prev = cut
                deltas += p.finish()
                assert shape(accumulate(deltas)) == shape(whole), text
                check_delta_order(deltas)


def test_finish_is_idempotent_and_feed_after_finish_is_an_error():
    p = StreamParser()
    p.feed("r</think>c")
    assert accumulate(p.finish()).content is None  # "c" was sent at feed time already
    assert p.finish() == []
    with pytest.raises(RuntimeError):
        p.feed("more")


class _ToolModel:
    """Stands in for a server's pydantic request model: only `model_dump()` matters."""

    def __init__(self, d):
        self._d = d

    def model_dump(self):
        return self._d


def test_tools_as_models_and_malformed_tool_schemas():
    text = "</think><tool_call>run_shell<arg_key>command</arg_key><arg_value>42</arg_value></tool_call>"
    assert summary(parse(text, tools=[_ToolModel(SHELL)]))[2] == [("run_shell", {"command": "42"})]
    weird = [None, "x", {"function": {"name": "run_shell", "parameters": "nope"}}, {"function": {"parameters": {}}}]
    assert summary(parse(text, tools=weird))[2] == [("run_shell", {"command": 42})]
