"""render_for_training: ids with per-token message index and generated mask, and where prefixes stay stable."""

from __future__ import annotations

import pytest

from model.chat import (
    reasoning_and_content,
    render,
    render_completion,
    render_for_training,
    render_ids,
    tool_calls_text,
)
from model.tokenizer import Tokenizer
from tests.model.chat_corpus import CORPUS, NAMES, SHELL, A, T, U, call
from tests.model.glm5_layout import write_glm5_layout_tokenizer

TOK = Tokenizer.shipped()


def last_user(msgs) -> int:
    return max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)


def expected_generated(msgs, i, clear_thinking, close_final_turn=True) -> str:
    """What the model writes for assistant message i, by the rules in model/chat.py's docstring."""
    reasoning, content = reasoning_and_content(msgs[i], i)
    kept = (not clear_thinking or i > last_user(msgs)) and reasoning
    text = (reasoning.strip() + "</think>" if kept else "") + content.strip() + tool_calls_text(msgs[i], i)
    nxt = msgs[i + 1]["role"] if i + 1 < len(msgs) else None
    if nxt is None:
        return text + ("<|endoftext|>" if close_final_turn else "")
    return text + {"user": "<|user|>", "tool": "<|observation|>"}.get(nxt, "")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("clear", [True, False])
def test_training_ids_are_the_rendered_ids(name, clear):
    _, msgs, tools = CORPUS[NAMES.index(name)]
    plain = render_ids(TOK, msgs, tools, add_generation_prompt=False, clear_thinking=clear)
    rc = render_for_training(TOK, msgs, tools, clear_thinking=clear, close_final_turn=False)
    assert rc.ids == plain
    assert len(rc.message_index) == len(rc.generated_mask) == len(rc.ids)
    closed = render_for_training(TOK, msgs, tools, clear_thinking=clear)
    eot = [TOK.special_id("<|endoftext|>")] if msgs[-1]["role"] == "assistant" else []
    assert closed.ids == plain + eot
    with_prompt = render_for_training(TOK, msgs, tools, add_generation_prompt=True, clear_thinking=clear)
    assert with_prompt.ids == render_ids(TOK, msgs, tools, clear_thinking=clear)
    assert not any(with_prompt.generated_mask[len(plain) :])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("clear", [True, False])
def test_generated_tokens_are_exactly_the_assistant_outputs(name, clear):
    _, msgs, tools = CORPUS[NAMES.index(name)]
    rc = render_for_training(TOK, msgs, tools, clear_thinking=clear)
    for i, m in enumerate(msgs):
        pos = [p for p, (j, g) in enumerate(zip(rc.message_index, rc.generated_mask, strict=True)) if j == i and g]
        if m["role"] != "assistant":
            assert pos == []
            continue
        want = expected_generated(msgs, i, clear)
        assert TOK.decode([rc.ids[p] for p in pos]) == want
        if pos:
            assert pos == list(range(pos[0], pos[-1] + 1))  # one contiguous span per turn
    # Template text outside messages: [gMASK]<sop> and the tools block, never generated.
    head = [p for p, j in enumerate(rc.message_index) if j == -1]
    assert head == list(range(len(head))) and not any(rc.generated_mask[p] for p in head)
    assert TOK.decode([rc.ids[p] for p in head]) == render(msgs[:0], tools, add_generation_prompt=False)


def test_golden_mask():
    msgs = [U("hi"), A("ok", reasoning="r", calls=[call("run_shell", {"command": "ls"})]), T("x"), A("bye")]
    rc = render_for_training(TOK, msgs, [SHELL])
    pieces = []
    for tid, j, g in zip(rc.ids, rc.message_index, rc.generated_mask, strict=True):
        if pieces and pieces[-1][1:3] == (j, g) and not TOK.is_special(tid) and not TOK.is_special(pieces[-1][3]):
            pieces[-1] = (pieces[-1][0] + TOK.decode([tid]), j, g, tid)
        else:
            pieces.append((TOK.decode([tid]), j, g, tid))
    got = [(text, j, g) for text, j, g, _ in pieces if j != -1]
    assert got == [
        ("<|user|>", 0, False),
        ("hi", 0, False),
        ("<|assistant|>", 1, False),
        ("<think>", 1, False),
        ("r", 1, True),
        ("</think>", 1, True),
        ("ok", 1, True),
        ("<tool_call>", 1, True),
        ("run_shell", 1, True),
        ("<arg_key>", 1, True),
        ("command", 1, True),
        ("</arg_key>", 1, True),
        ("<arg_value>", 1, True),
        ("ls", 1, True),
        ("</arg_value>", 1, True),
        ("</tool_call>", 1, True),
        ("<|observation|>", 1, True),  # the token that ended turn 1 belongs to it
        ("<tool_response>", 2, False),
        ("x", 2, False),
        ("</tool_response>", 2, False),
        ("<|assistant|>", 3, False),
        ("</think>", 3, False),  # lone separator of a turn without reasoning: template text
        ("bye", 3, True),
        ("<|endoftext|>", 3, True),  # closes the final turn (render_for_training only)
    ]
    assert rc.labels()[: len(rc.ids)] == [t if g else -100 for t, g in zip(rc.ids, rc.generated_mask, strict=True)]


def stable_prefix(msgs, tools, k, clear) -> bool:
    part = render_for_training(TOK, msgs[:k], tools, clear_thinking=clear, close_final_turn=False)
    whole = render_for_training(TOK, msgs, tools, clear_thinking=clear, close_final_turn=False)
    n = len(part.ids)
    # The prefix's last assistant turn has no end token yet, so compare masks only up to where both agree it ends.
    return (
        whole.ids[:n] == part.ids
        and whole.message_index[:n] == part.message_index
        and whole.generated_mask[:n] == part.generated_mask
    )


@pytest.mark.parametrize("name", NAMES)
def test_prefix_stability_and_where_clear_thinking_breaks_it(name):
    _, msgs, tools = CORPUS[NAMES.index(name)]
    for k in range(1, len(msgs) + 1):
        assert stable_prefix(msgs, tools, k, clear=False), k
        # clear_thinking=True drops the reasoning of turns that a later user message pushes into the past.
        lu_part, lu_whole = last_user(msgs[:k]), last_user(msgs)
        rewritten = any(
            m["role"] == "assistant" and reasoning_and_content(m, j)[0] and lu_part < j < lu_whole
            for j, m in enumerate(msgs[:k])
        )
        assert stable_prefix(msgs, tools, k, clear=True) == (not rewritten), k


def test_clear_thinking_rewrites_an_earlier_turn():
    msgs = [U("a"), A("x", reasoning="because"), U("b")]
    before = render(msgs[:2], add_generation_prompt=False)
    after = render(msgs, add_generation_prompt=False)
    assert before.endswith("<|assistant|><think>because</think>x")
    assert "<think>because</think>" not in after and "<|assistant|></think>x<|user|>b" in after


@pytest.mark.parametrize("name", NAMES)
def test_prompt_plus_completion_is_the_next_prompt(name):
    """Token in, token out: the generation prompt plus what the model wrote is the start of the next render,
    when the turn has reasoning (thinking on), or no reasoning with thinking off. Thinking on without
    reasoning breaks it: the prompt ends with <think>, the rendered turn opens with a lone </think>."""
    _, msgs, tools = CORPUS[NAMES.index(name)]
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        has_reasoning = bool(reasoning_and_content(m, i)[0])
        for thinking in (True, False):
            prompt = render_ids(TOK, msgs[:i], tools, enable_thinking=thinking)
            completion = TOK.encode(render_completion(m, enable_thinking=thinking))
            whole = render_ids(TOK, msgs[: i + 1], tools, add_generation_prompt=False)
            holds = prompt + completion == whole
            if thinking:
                assert holds == has_reasoning, i
            elif not has_reasoning:
                assert holds, i


def test_a_real_glm5_tokenizer_layout_works(tmp_path):
    tok = Tokenizer.from_dir(write_glm5_layout_tokenizer(tmp_path))
    assert tok.special_id("<|endoftext|>") == 154820 and tok.special_id("</arg_value>") == 154850
    assert tok.eos_token_ids == [154820, 154827, 154829] and tok.pad_token_id == 154820
    _, msgs, tools = CORPUS[NAMES.index("parallel_tool_calls")]
    rc = render_for_training(tok, msgs, tools)
    assert rc.ids == render_ids(tok, msgs, tools, add_generation_prompt=False) + [154820]
    assert tok.decode(rc.ids) == render(msgs, tools, add_generation_prompt=False) + "<|endoftext|>"
    obs = [p for p, t in enumerate(rc.ids) if t == 154829]
    assert obs and rc.generated_mask[obs[0]] and msgs[rc.message_index[obs[0]]]["role"] == "assistant"
    assert max(rc.ids) < 154851 and any(t > 8191 for t in rc.ids)
