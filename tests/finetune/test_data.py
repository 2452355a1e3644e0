"""Training data in: every format to sequences whose masks are our chat format's, recorded ids used as they are,
truncated turns without an end token, denied calls as context, outcome filters, bad records named by line."""

from __future__ import annotations

import json

import pytest

from agent.trajectory import TrajectoryWriter
from finetune.data.report import BadRecord
from finetune.data.sources import load_sequences
from finetune.data.trajectories import DataOptions
from model.chat import END_OF_TEXT, render_for_training
from model.tokenizer import Tokenizer

TOK = Tokenizer.shipped()
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def _call(i: int, content: str, tool: bool = True) -> dict:
    m = {"role": "assistant", "content": content, "reasoning_content": f"think {i}"}
    if tool:
        m["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"x": 1}'}}]
    return m


def _session(path, decisions=("allow", "allow"), finish=("tool_calls", "tool_calls", "stop"), ids=None, tool=({}, {})):
    """A glm5 trajectory: user task, two tool-calling turns with their results (`tool`: more fields of each
    result's record), a final answer."""
    w = TrajectoryWriter(path)
    w.write("session", id="s", schema="glm5-trajectory/1", tools=TOOLS)
    convo = [{"role": "user", "content": "fix the bug"}]
    w.write("message", index=0, message=convo[0])
    replies = [_call(0, "look"), _call(1, "edit"), _call(2, "done", tool=False)]
    for i, reply in enumerate(replies):
        choice = {"message": reply, "finish_reason": finish[i]}
        response = {"choices": [choice]}
        if ids is not None:
            choice["token_ids"] = ids[i][1]
            response["prompt_token_ids"] = ids[i][0]
        w.write("model_call", step=i, n_messages=len(convo), response=response)
        convo.append(reply)
        w.write("message", index=len(convo) - 1, message=reply)
        if i < 2:
            w.write("tool", step=i, call_id=f"c{i}", name="bash", decision=decisions[i],
                    **{"result": "ok", **tool[i]})  # fmt: skip
            convo.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"})
            w.write("message", index=len(convo) - 1, message=convo[-1])
    w.close()
    return convo


def _targets(seq) -> list[int]:
    return [t for t, m in zip(seq.ids, seq.mask, strict=True) if m]


def _load(paths, **opts):
    return load_sequences(paths, TOK, DataOptions(**opts))


def test_a_session_is_one_sequence_with_every_model_turn_trained_as_the_chat_format_marks_it(tmp_path):
    convo = _session(tmp_path / "s.jsonl")
    seqs, report = _load([tmp_path])
    assert len(seqs) == 1 and report.sequences == 1 and report.sessions == 1 and not report.skipped
    want = render_for_training(TOK, convo, TOOLS, clear_thinking=False)
    assert seqs[0].ids == want.ids and seqs[0].mask == want.generated_mask
    # Each turn's closing role token is a target, and the final turn ends with <|endoftext|>.
    obs, eot = TOK.special_id("<|observation|>"), TOK.special_id(END_OF_TEXT)
    closes = [seqs[0].mask[i] for i, t in enumerate(seqs[0].ids) if t == obs]
    assert closes == [True, True] and seqs[0].ids[-1] == eot and seqs[0].mask[-1]
    assert TOK.decode(_targets(seqs[0])).count("think ") == 3


def test_denied_calls_are_context_unless_included_and_a_truncated_turn_gets_no_end_token(tmp_path):
    _session(tmp_path / "s.jsonl", decisions=("denied", "allow"), finish=("tool_calls", "tool_calls", "length"))
    (seq,), report = _load([tmp_path])
    text = TOK.decode(_targets(seq))
    assert "look" not in text and "edit" in text and "done" in text
    assert report.filtered == {"turns with a denied tool call (context, not trained)": 1}
    assert seq.ids[-1] != TOK.special_id(END_OF_TEXT)  # cut at max_tokens: the model did not end it
    (seq,), _ = _load([tmp_path], include_denied=True)
    assert "look" in TOK.decode(_targets(seq))


def test_a_call_the_tool_refused_is_context_and_a_command_that_failed_is_trained(tmp_path):
    # GLM-5 masks erroneous segments: the refused call stays in the sequence (the model learns what followed
    # its error), its tokens are not targets. A nonzero exit (a failing test run) is a call that ran: trained.
    refused = {"is_error": True, "failed": "call", "result": "error: old_string was not found in a.py"}
    _session(tmp_path / "s.jsonl", tool=(refused, {"is_error": True, "result": "1 failed\n[exit code 1]"}))
    (seq,), report = _load([tmp_path])
    text = TOK.decode(_targets(seq))
    assert "look" not in text and "edit" in text and "done" in text
    assert "look" in TOK.decode(seq.ids)  # kept as context
    assert report.filtered == {"turns with a failed tool call (context, not trained)": 1}
    (seq,), report = _load([tmp_path], include_failed_calls=True)
    assert "look" in TOK.decode(_targets(seq)) and not report.filtered
    # A tool that broke (a bug, not the model's call) is not the model's error: trained.
    _session(tmp_path / "c.jsonl", tool=({"is_error": True, "failed": "crash"}, {}))
    (seq,), report = _load([tmp_path / "c.jsonl"])
    assert "look" in TOK.decode(_targets(seq)) and not report.filtered


def test_recorded_token_ids_are_trained_as_sampled(tmp_path):
    # Ids the renderer would never produce: the sequence must be these, not a re-tokenization.
    obs = TOK.special_id("<|observation|>")
    p0 = [5, 6, 7]
    c0 = [100, 101]  # the stop token (<|observation|>) was not returned: the next prompt's first token is it
    p1 = p0 + c0 + [obs, 8, 9]
    c1 = [102, obs]  # this one includes its stop token
    p2 = p1 + c1 + [10]
    c2 = [103, 104]
    _session(tmp_path / "s.jsonl", ids=[(p0, c0), (p1, c1), (p2, c2)])
    (seq,), report = _load([tmp_path / "s.jsonl"])
    assert seq.tito and report.tito == 1
    assert seq.ids == p2 + c2 + [TOK.special_id(END_OF_TEXT)]
    targets = _targets(seq)
    assert targets == [100, 101, obs, 102, obs, 103, 104, TOK.special_id(END_OF_TEXT)]
    # A prompt that does not extend the previous ids (drift) falls back to the rendering.
    _session(tmp_path / "d.jsonl", ids=[(p0, c0), ([1] + p1, c1), (p2, c2)])
    (seq,), _ = _load([tmp_path / "d.jsonl"])
    assert not seq.tito


def test_a_compaction_starts_a_new_branch(tmp_path):
    w = TrajectoryWriter(tmp_path / "c.jsonl")
    w.write("session", id="s", schema="glm5-trajectory/1", tools=[])
    w.write("message", index=0, message={"role": "user", "content": "a"})
    w.write(
        "model_call", step=0, n_messages=1, response={"choices": [{"message": {"role": "assistant", "content": "x"}}]}
    )
    w.write("message", index=1, message={"role": "assistant", "content": "x"})
    w.write("compaction", summary="s", messages=[{"role": "user", "content": "summary"}])
    w.write(
        "model_call", step=1, n_messages=1, response={"choices": [{"message": {"role": "assistant", "content": "y"}}]}
    )
    w.close()
    seqs, _ = _load([tmp_path])
    assert len(seqs) == 2


def test_bad_records_are_skipped_and_named_by_line_or_fail_with_strict(tmp_path):
    path = tmp_path / "s.jsonl"
    _session(path)
    lines = path.read_text().splitlines()
    lines.insert(
        3, '{"type": "message", "index": 1, "message": {"role": "assistant", "tool_calls": [{"function": 1}]}}'
    )
    lines.insert(2, "{not json")
    path.write_text("\n".join(lines) + "\n")
    seqs, report = _load([path], allow_foreign=True)  # lines written by hand: not this machine's (provenance)
    assert len(report.skipped) == 2, report.skipped
    assert report.skipped[0].startswith(f"{path}:3: not JSON")
    assert report.skipped[1].startswith(f"{path}:5: bad message")
    with pytest.raises(BadRecord, match=r"s\.jsonl:3: not JSON"):
        _load([path], strict=True, allow_foreign=True)
    _, report = _load([path])  # by default the hand-written line and the ones after it are left out, and named
    assert any(s.startswith(f"{path}:5: this line and the ones after it") for s in report.skipped), report.skipped


def _trial(run, task, resolved, reward, make):
    d = run / "trials" / task / "0"
    d.mkdir(parents=True)
    make(d / "trajectory.jsonl")
    (d / "report.json").write_text(json.dumps({"status": "x", "resolved": resolved, "reward": reward}))


def test_bench_runs_keep_resolved_trials_by_default_and_filter_on_reward(tmp_path):
    run = tmp_path / "run"
    _trial(run, "a", True, 1.0, _session)
    _trial(run, "b", False, 0.0, _session)
    _trial(run, "c", None, 0.0, _session)  # an infrastructure error: unknown, never counted as resolved
    seqs, report = _load([run])
    assert len(seqs) == 1 and "trials/a/" in seqs[0].source
    assert report.filtered == {"trials not resolved": 1, "trials with an unknown outcome": 1}
    seqs, _ = _load([run], only_resolved=False)
    assert len(seqs) == 3
    seqs, report = _load([run], only_resolved=False, min_reward=0.5)
    assert len(seqs) == 1


def test_openai_chat_jsonl_mini_swe_agent_and_harbor_atif(tmp_path):
    chat = tmp_path / "chat.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "A1", "weight": 0},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": "A2"},
            ],
            "tools": TOOLS,
        },
        {"messages": [{"role": "wizard", "content": "?"}]},
    ]
    chat.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (seq,), report = _load([chat])
    text = TOK.decode(_targets(seq))
    assert "A2" in text and "A1" not in text
    assert report.skipped == [f"{chat}:2: message 0: role must be one of system, user, assistant, tool"]

    mini = tmp_path / "django-1.traj.json"
    mini.write_text(
        json.dumps(
            {
                "info": {"exit_status": "Submitted", "submission": "diff"},
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "task"},
                    {"role": "assistant", "content": "```bash\nls\n```", "extra": {"cost": 1}},
                    {"role": "user", "content": "out"},
                    {"role": "assistant", "content": "```bash\nsubmit\n```"},
                ],
                "trajectory_format": "mini-swe-agent-1.1",
            }
        )
    )
    (seq,), _ = _load([mini])
    assert TOK.decode(_targets(seq)).count("```bash") == 2

    trial = tmp_path / "job" / "t1"
    (trial / "agent").mkdir(parents=True)
    atif = {
        "schema_version": "ATIF-v1.4",
        "session_id": "x",
        "agent": {"name": "a", "version": "1"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "task"},
            {
                "step_id": 2,
                "source": "agent",
                "message": "run",
                "reasoning_content": "r",
                "tool_calls": [{"tool_call_id": "k", "function_name": "bash", "arguments": {"cmd": "ls"}}],
                "observation": {"results": [{"source_call_id": "k", "content": "a.py"}]},
            },
            {"step_id": 3, "source": "agent", "message": "finished"},
        ],
    }
    (trial / "agent" / "trajectory.json").write_text(json.dumps(atif))
    (trial / "result.json").write_text(json.dumps({"verifier_result": {"rewards": {"reward": 0.0}}}))
    (seq,), _ = _load([trial / "agent" / "trajectory.json"])
    text = TOK.decode(_targets(seq))
    assert "run" in text and "finished" in text and "a.py" not in text and "<tool_call>bash" in text
    seqs, report = _load([trial / "agent" / "trajectory.json"], min_reward=0.5)
    assert not seqs and report.filtered


def test_a_denied_call_stays_denied_when_a_later_call_reuses_its_id(tmp_path):
    # issue 40, item 7: decisions were keyed by the call id alone, which the model chooses: a later allowed call
    # with the same id made the earlier denied one training data
    w = TrajectoryWriter(tmp_path / "r.jsonl")
    w.write("session", id="s", schema="glm5-trajectory/1", tools=TOOLS)
    convo = [{"role": "user", "content": "fix the bug"}]
    w.write("message", index=0, message=convo[0])
    for i, decision in enumerate(("denied", "allow", None)):
        reply = _call(i, ("rm -rf", "look", "done")[i], tool=decision is not None)
        if decision is not None:
            reply["tool_calls"][0]["id"] = "same"
        w.write("model_call", step=i, n_messages=len(convo),
                response={"choices": [{"message": reply, "finish_reason": "tool_calls" if decision else "stop"}]})  # fmt: skip
        convo.append(reply)
        w.write("message", index=len(convo) - 1, message=reply)
        if decision is not None:
            w.write("tool", step=i, call_id="same", name="bash", decision=decision, result="r")
            convo.append({"role": "tool", "tool_call_id": "same", "content": "r"})
            w.write("message", index=len(convo) - 1, message=convo[-1])
    w.close()
    _, report = _load([tmp_path / "r.jsonl"])
    assert report.filtered["turns with a denied tool call (context, not trained)"] == 1, report.filtered
