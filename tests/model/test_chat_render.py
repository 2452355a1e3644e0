"""model/chat.py renders the GLM-5 format, and chat_template.jinja renders the same bytes through transformers."""

from __future__ import annotations

import itertools
import json

import pytest

from model.chat import normalize_messages, render
from tests.model.chat_corpus import CORPUS, NAMES, WEATHER, A, T, U, call

MODES = list(itertools.product([True, False], [True, False], [True, False]))  # thinking, clear, gen prompt


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from model.tokenizer import save_tokenizer_files

    out = tmp_path_factory.mktemp("ckpt")
    save_tokenizer_files(out)
    return transformers.AutoTokenizer.from_pretrained(out)


def hf_render(tok, messages, tools, thinking, clear, gen):
    return tok.apply_chat_template(
        normalize_messages(messages),
        tools=tools,
        tokenize=False,
        add_generation_prompt=gen,
        enable_thinking=thinking,
        clear_thinking=clear,
    )


@pytest.mark.parametrize("name", NAMES)
def test_jinja_template_renders_the_same_bytes(hf_tokenizer, name):
    _, messages, tools = CORPUS[NAMES.index(name)]
    for thinking, clear, gen in MODES:
        ours = render(messages, tools, add_generation_prompt=gen, enable_thinking=thinking, clear_thinking=clear)
        assert hf_render(hf_tokenizer, messages, tools, thinking, clear, gen) == ours, (thinking, clear, gen)


def test_jinja_template_without_kwargs_uses_the_defaults(hf_tokenizer):
    _, messages, tools = CORPUS[NAMES.index("reasoning_old_and_new_turns_with_tools")]
    hf = hf_tokenizer.apply_chat_template(normalize_messages(messages), tools=tools, tokenize=False)
    assert hf == render(messages, tools, add_generation_prompt=False)


def test_jinja_takes_dict_arguments_without_normalizing(hf_tokenizer):
    messages = [U("ls"), A("", calls=[call("get_weather", {"city": "Oslo", "days": 1}, as_string=False)])]
    hf = hf_tokenizer.apply_chat_template(messages, tools=[WEATHER], tokenize=False)
    assert hf == render(messages, [WEATHER], add_generation_prompt=False)


def test_jinja_rejects_what_render_rejects(hf_tokenizer):
    with pytest.raises(Exception, match="message 1: unknown role"):
        hf_tokenizer.apply_chat_template([U("x"), {"role": "critic", "content": "y"}], tokenize=False)
    with pytest.raises(Exception, match="message 1: tool call 0 has no function name"):
        hf_tokenizer.apply_chat_template([U("x"), A("", calls=[{"function": {"arguments": {}}}])], tokenize=False)


def test_golden_tool_round():
    messages = [
        {"role": "system", "content": "sys"},
        U("Weather in 北京?"),
        A("Let me check.", reasoning=" plan ", calls=[call("get_weather", {"city": "北京", "days": 2})]),
        T("sunny"),
        T("windy", "call_1"),
    ]
    text = render(messages, [WEATHER])
    tools_json = json.dumps(WEATHER, ensure_ascii=False)
    assert text == (
        "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{tools_json}\n</tools>\n\n"
        "For each function call, output the function name and arguments within the following XML format:\n"
        "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
        "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
        "<|system|>sys<|user|>Weather in 北京?"
        "<|assistant|><think>plan</think>Let me check."
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        "<|observation|><tool_response>sunny</tool_response><tool_response>windy</tool_response>"
        "<|assistant|><think>"
    )


def test_old_reasoning_is_cleared_unless_asked_to_keep_it():
    messages = [U("a"), A("x", reasoning="r1"), U("b"), A("y", reasoning="r2")]
    assert render(messages, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>a<|assistant|></think>x<|user|>b<|assistant|><think>r2</think>y"
    )
    assert render(messages, add_generation_prompt=False, clear_thinking=False) == (
        "[gMASK]<sop><|user|>a<|assistant|><think>r1</think>x<|user|>b<|assistant|><think>r2</think>y"
    )


def test_generation_prompt_follows_enable_thinking():
    assert render([U("q")]).endswith("<|user|>q<|assistant|><think>")
    assert render([U("q")], enable_thinking=False).endswith("<|user|>q<|assistant|></think>")
    assert render([U("q")], add_generation_prompt=False) == "[gMASK]<sop><|user|>q"


def test_argument_values_strings_raw_others_json():
    m = A(None, calls=[call("f", {"s": "a b", "n": 1.5, "b": True, "z": None, "o": {"k": [1, "é"]}})])
    assert render([U("x"), m], add_generation_prompt=False).endswith(
        "<tool_call>f<arg_key>s</arg_key><arg_value>a b</arg_value><arg_key>n</arg_key><arg_value>1.5</arg_value>"
        "<arg_key>b</arg_key><arg_value>true</arg_value><arg_key>z</arg_key><arg_value>null</arg_value>"
        '<arg_key>o</arg_key><arg_value>{"k": [1, "é"]}</arg_value></tool_call>'
    )


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([U("a"), {"role": "critic", "content": "b"}], r"message 1: unknown role 'critic'"),
        ([{"content": "no role"}], r"message 0: unknown role None"),
        (["just a string"], r"message 0: not an object"),
        (
            [U("a"), A("", calls=[{"type": "function", "function": {"arguments": "{}"}}])],
            r"message 1: tool call 0 has no function name",
        ),
        (
            [U("a"), A("", calls=[call("f", {}), {"function": {"name": ""}}])],
            r"message 1: tool call 1 has no function name",
        ),
        (
            [U("a"), A("", calls=[{"function": {"name": "f", "arguments": "{oops"}}])],
            r"message 1: tool call 0 \(f\): arguments are not valid JSON",
        ),
        (
            [U("a"), A("", calls=[{"function": {"name": "f", "arguments": "[1, 2]"}}])],
            r"message 1: tool call 0 \(f\): arguments must be a JSON object",
        ),
        (
            [U("a"), A("", calls=[{"function": {"name": "f", "arguments": 42}}])],
            r"message 1: tool call 0 \(f\): arguments must be",
        ),
        ([U({"text": "dict content"})], r"message 0: content must be"),
        ([U([{"type": "image_url", "image_url": {}}])], r"message 0: content parts must be"),
    ],
)
def test_bad_input_names_the_message(messages, match):
    with pytest.raises(ValueError, match=match):
        render(messages)


def test_messages_must_be_a_list():
    with pytest.raises(ValueError, match="list of message objects"):
        render("hello")


def test_tools_must_be_objects():
    with pytest.raises(ValueError, match=r"tools\[1\]: not an object"):
        render([U("x")], tools=[WEATHER, "get_weather"])
