"""Token in, token out (finetune/rl/tito.py, session_model.py): the trained ids are the sampled ids call by call,
the loss mask covers exactly the sampled tokens, later prompts extend earlier ones by the chat format's tokens,
and a new branch starts where GLM-5's template rewrites an earlier turn."""

from __future__ import annotations

import pytest

from finetune.rl.server import Generated
from finetune.rl.session_model import SessionModel
from model.chat import render_for_training
from model.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
          "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.shipped()


class ScriptedServer:
    """A rollout server that 'samples' the texts it is given, in order (tokens and logprobs made up)."""

    def __init__(self, tok, replies: list[str], version: int = 3):
        self.tok, self.replies, self.version = tok, list(replies), version
        self.prompts: list[list[int]] = []

    def generate(self, prompt_ids, params, session=""):
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.replies.pop(0))
        return Generated(ids, [-0.1 - 0.01 * i for i in range(len(ids))], self.version, self.version + 1, "stop")


def _check_identity(model: SessionModel) -> None:
    """Every call's sampled ids sit in its branch's sample at its offset with mask 1 and its logprobs; nothing
    else has mask 1."""
    samples = model.tito.samples()
    covered = {b: set() for b in range(len(samples))}
    for c in model.tito.calls:
        s = samples[c.branch]
        n = len(c.output_ids)
        assert s.ids[c.offset : c.offset + n] == c.output_ids  # trained ids == sampled ids, this call
        assert s.ids[: c.offset] == c.prompt_ids  # the prompt the engine saw is the sample's prefix
        assert s.mask[c.offset : c.offset + n] == [1] * n
        assert s.logprobs[c.offset : c.offset + n] == c.logprobs
        covered[c.branch] |= set(range(c.offset, c.offset + n))
    for b, s in enumerate(samples):
        assert {t for t, m in enumerate(s.mask) if m} == covered[b]  # masks cover exactly the sampled tokens


def test_a_tool_session_is_one_branch_whose_prompts_extend_the_sampled_tokens(tok):
    replies = [
        "look first</think>I will list files.<tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value>"
        "</tool_call><|observation|>",
        "done</think>All good.<|user|>",
    ]
    server = ScriptedServer(tok, replies)
    model = SessionModel(server, tok, "s", max_new_tokens=64, temperature=1.0, seed=0)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list the files"}]
    r1 = model.query(messages, TOOLS)
    assert r1.tool_calls[0]["function"]["name"] == "bash" and r1.reasoning_content == "look first"
    messages += [r1.message(), {"role": "tool", "tool_call_id": r1.tool_calls[0]["id"], "content": "a.py b.py"}]
    r2 = model.query(messages, TOOLS)
    assert r2.content == "All good."
    assert len(model.tito.branches) == 1 and len(model.tito.calls) == 2
    first, second = server.prompts
    sampled = model.tito.calls[0].output_ids
    assert second[: len(first) + len(sampled)] == first + sampled  # appended, not re-tokenized
    # The appended part is exactly the chat format's tokens for the tool message and the generation prompt
    # (the sampled <|observation|> ended the turn, so it is not repeated).
    tail = second[len(first) + len(sampled) :]
    assert tok.decode(tail) == "<tool_response>a.py b.py</tool_response><|assistant|><think>"
    _check_identity(model)
    # The first prompt is the template's rendering of the conversation.
    assert first == render_for_training(tok, messages[:2], TOOLS, add_generation_prompt=True).ids


def test_thinking_off_opens_each_turn_with_the_closed_think_and_parses_content(tok):
    """--no-thinking: the generation prompt is `<|assistant|></think>` (what `enable_thinking=false` renders and
    what a session recorded without reasoning was trained on), and the reply is content, not reasoning."""
    replies = ["<tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call><|observation|>",
               "All good.<|user|>"]  # fmt: skip
    server = ScriptedServer(tok, replies)
    model = SessionModel(server, tok, "s", max_new_tokens=64, temperature=1.0, seed=0, thinking=False)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list the files"}]
    r1 = model.query(messages, TOOLS)
    assert r1.tool_calls[0]["function"]["name"] == "bash" and not r1.reasoning_content
    messages += [r1.message(), {"role": "tool", "tool_call_id": r1.tool_calls[0]["id"], "content": "a.py"}]
    r2 = model.query(messages, TOOLS)
    assert r2.content == "All good." and not r2.reasoning_content
    first, second = server.prompts
    assert tok.decode(first).endswith("<|assistant|></think>")
    assert tok.decode(second[len(first) + len(model.tito.calls[0].output_ids) :]) == (
        "<tool_response>a.py</tool_response><|assistant|></think>"
    )
    assert len(model.tito.branches) == 1
    _check_identity(model)
    # what SFT trains for the same conversation is the same prefix: the first prompt and the first reply
    whole = render_for_training(tok, messages + [r2.message()], TOOLS)
    assert whole.ids[: len(second)] == second


def test_a_model_that_stopped_on_another_tag_gets_the_templates_tag_as_prompt(tok):
    replies = ["x</think><tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call><|user|>",
               "ok</think>fine<|user|>"]  # fmt: skip
    model = SessionModel(ScriptedServer(tok, replies), tok, "s", 64, 1.0, 0)
    messages = [{"role": "user", "content": "go"}]
    r = model.query(messages, TOOLS)
    messages += [r.message(), {"role": "tool", "tool_call_id": "c", "content": "out"}]
    model.query(messages, TOOLS)
    s = model.tito.samples()[0]
    c0 = model.tito.calls[0]
    after = s.ids[c0.offset + len(c0.output_ids) :][:1]
    assert tok.decode(after) == "<|observation|>" and s.mask[c0.offset + len(c0.output_ids)] == 0
    _check_identity(model)


def test_a_user_message_after_reasoning_starts_a_new_branch_unless_reasoning_is_kept(tok):
    replies = ["think a</think>answer a<|user|>", "think b</think>answer b<|user|>"]
    for keep, branches in ((False, 2), (True, 1)):
        server = ScriptedServer(tok, replies)
        model = SessionModel(server, tok, "s", 64, 1.0, 0, keep_reasoning=keep)
        messages = [{"role": "user", "content": "q"}]
        r = model.query(messages)
        messages += [r.message(), {"role": "user", "content": "again"}]
        model.query(messages)
        assert len(model.tito.branches) == branches
        _check_identity(model)
        second = server.prompts[1]
        if keep:  # append-only: the old reasoning stays in the prompt
            assert second[: len(server.prompts[0])] == server.prompts[0]
            assert "think a" in tok.decode(second)
        else:  # the template's prompt, which dropped the old reasoning (what `glm5 serve` would render)
            assert "think a" not in tok.decode(second) and "answer a" in tok.decode(second)
            assert second == render_for_training(tok, messages, add_generation_prompt=True).ids
        assert [s.version for s in model.tito.samples()] == [3] * branches


def test_a_rewritten_history_starts_a_new_branch(tok):
    model = SessionModel(ScriptedServer(tok, ["a</think>one<|user|>", "b</think>two<|user|>"]), tok, "s", 64, 1.0, 0)
    model.query([{"role": "user", "content": "q"}])
    model.query([{"role": "system", "content": "summary of the session"}, {"role": "user", "content": "go on"}])
    assert len(model.tito.branches) == 2 and len(model.tito.samples()) == 2
    _check_identity(model)


def test_logprobs_must_match_the_tokens(tok):
    class Broken(ScriptedServer):
        def generate(self, prompt_ids, params, session=""):
            g = super().generate(prompt_ids, params, session)
            return Generated(g.ids, g.logprobs[:-1], 0, 0, "stop")

    model = SessionModel(Broken(tok, ["a</think>b<|user|>"]), tok, "s", 64, 1.0, 0)
    with pytest.raises(ValueError, match="logprobs for"):
        model.query([{"role": "user", "content": "q"}])


def test_a_call_whose_tool_call_was_refused_is_marked_and_its_span_reaches_the_sample(tok):
    """The tool answering `error: ...` marks the call that made it (a command's nonzero exit does not); the sample
    carries the refused call's span, exactly its sampled ids."""
    edit = ("</think><tool_call>bash<arg_key>command</arg_key><arg_value>{}</arg_value></tool_call>"
            "<|observation|>")  # fmt: skip
    server = ScriptedServer(tok, [edit.format("sed x"), edit.format("false"), edit.format("ls"), "</think>Done."])
    model = SessionModel(server, tok, "s", max_new_tokens=64, temperature=1.0, seed=0)
    messages = [{"role": "user", "content": "fix it"}]
    results = ["error: old_string was not found in a.py; read the file and quote it exactly", "[exit code 1]",
               "a.py"]  # fmt: skip
    for text in results:
        r = model.query(messages, TOOLS)
        messages += [r.message(), {"role": "tool", "tool_call_id": r.tool_calls[0]["id"], "content": text}]
    model.query(messages, TOOLS)
    assert [c.refused for c in model.tito.calls] == [True, False, False, False]
    (sample,) = model.tito.samples()
    first = model.tito.calls[0]
    assert sample.refused == [[first.offset, first.offset + len(first.output_ids)]]
    _check_identity(model)
