"""The scripted expert: it finds and fixes the line from the issue alone, and answers as an OpenAI endpoint."""

from __future__ import annotations

import json

import pytest

from finetune.proof.expert import Issue, fix_line, next_message, parse_issue
from plugins.bench_suites.repair_family import generate


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_the_expert_derives_every_fix_from_the_issue_and_the_file(split):
    for i in range(32):
        inst = generate(2, split, i)
        issue = parse_issue(inst.problem_statement)
        assert issue is not None, inst.problem_statement
        assert (issue.function, issue.path) == (inst.bug.name, inst.path)
        assert issue.test == f"tests/test_{inst.buggy[0]}.py::test_{inst.bug.name}"
        before = inst.files(fixed=False)[inst.path].splitlines()
        old, new = fix_line(before, issue)
        assert (old, new) == (inst.bug.old, inst.bug.new)  # as the issue quotes them: a copy, not a lookup
        fixed = inst.files(fixed=False)[inst.path].replace(old, new, 1)
        assert fixed == inst.files(fixed=True)[inst.path], (inst.bug.kind, old, new)


def test_what_the_expert_cannot_parse_or_find_ends_the_session_with_a_reason():
    assert parse_issue("Something is wrong somewhere.") is None
    msg = next_message([{"role": "user", "content": "Something is wrong somewhere."}])
    assert "tool_calls" not in msg and "cannot tell" in msg["content"]
    issue = Issue("absent", "pkg/m.py", "return a - b", "return a + b", "tests/test_m.py::test_absent")
    assert fix_line(["def present(a, b):", "    return a - b"], issue) is None
    # the quoted line must be in the named function, and only once in the file (the edit replaces a unique string)
    issue = Issue("present", "pkg/m.py", "return a - b", "return a + b", "tests/test_m.py::test_present")
    assert fix_line(["def present(a, b):", "    return a - b"], issue) == ("return a - b", "return a + b")
    assert fix_line(["def present(a, b):", "    return a", "", "def other(a, b):", "    return a - b"], issue) is None
    twice = ["def present(a, b):", "    return a - b", "", "def other(a, b):", "    return a - b"]
    assert fix_line(twice, issue) is None


def _tool(text: str) -> dict:
    return {"role": "tool", "tool_call_id": "x", "content": text}


def test_the_expert_reads_edits_tests_and_answers():
    inst = generate(0, "train", 1)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"<issue>\n{inst.problem_statement}"}]
    steps = []
    listing = "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(inst.files(False)[inst.path].splitlines(), 1))
    results = [listing, "edited", "1 passed in 0.01s\n[exit code 0]"]
    for result in results:
        msg = next_message(msgs)
        (call,) = msg["tool_calls"]
        steps.append((call["function"]["name"], json.loads(call["function"]["arguments"])))
        msgs += [msg, _tool(result)]
    assert [name for name, _ in steps] == ["read", "edit", "bash"]
    assert steps[0][1] == {"path": inst.path}
    assert steps[1][1] == {"path": inst.path, "old_string": inst.bug.old, "new_string": inst.bug.new}
    assert steps[2][1]["command"].endswith(inst.fail_to_pass[0])
    final = next_message(msgs)
    assert "tool_calls" not in final and "passes" in final["content"]
    msgs[-1] = _tool("F\n1 failed in 0.02s\n[exit code 1]")
    assert "still fails" in next_message(msgs)["content"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_endpoint_answers_the_real_client(stream):
    from agent.client import ChatClient, ClientConfig
    from finetune.proof.expert_server import MODEL, ExpertServer

    inst = generate(0, "heldout", 0)
    with ExpertServer() as server:
        client = ChatClient(ClientConfig(base_url=server.base_url, model=MODEL, api_key="unused", stream=stream))
        resp = client.query([{"role": "user", "content": f"<issue>\n{inst.problem_statement}\n</issue>"}], [])
        assert server.app.state.requests == 1
    (call,) = resp.tool_calls
    assert call["function"]["name"] == "read" and json.loads(call["function"]["arguments"]) == {"path": inst.path}
    assert resp.finish_reason == "tool_calls"


def _play(inst, slip_rate: float) -> list[tuple[str, dict, str]]:
    """A session of the expert against the task's file, the edit tool played as ours answers: (tool, args, result)."""
    text = inst.files(False)[inst.path]
    listing = "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(text.splitlines(), 1))
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"<issue>\n{inst.problem_statement}"}]
    steps = []
    while (msg := next_message(msgs, slip_rate)).get("tool_calls"):
        (call,) = msg["tool_calls"]
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        if name == "read":
            result = listing
        elif name == "edit":
            result = ("error: missing required argument `path`" if "path" not in args else
                      "edited" if text.count(args["old_string"]) == 1 else
                      f"error: old_string was not found in {args['path']}")  # fmt: skip
        else:
            result = "1 passed in 0.01s\n[exit code 0]"
        steps.append((name, args, result))
        msgs += [msg, {"role": "tool", "tool_call_id": call["id"], "content": result}]
        assert len(steps) < 8
    assert "passes" in msg["content"]
    return steps


def test_with_a_slip_rate_the_expert_fails_an_edit_as_a_model_would_then_makes_the_right_one():
    from finetune.proof.expert import slips_for

    kinds, counts = set(), []
    for i in range(40):
        inst = generate(5, "train", i)
        steps = _play(inst, 0.5)
        names = [name for name, _, _ in steps]
        slips = slips_for(f"<issue>\n{inst.problem_statement}", 0.5)
        counts.append(slips)
        assert names == ["read"] + ["edit"] * (slips + 1) + ["bash"]
        *failed, right = [(args, result) for name, args, result in steps if name == "edit"]
        assert right == ({"path": inst.path, "old_string": inst.bug.old, "new_string": inst.bug.new}, "edited")
        for args, result in failed:  # a slip is refused by the tool, never applied
            assert result.startswith("error:")
            assert args["new_string"] == inst.bug.new
            kinds.add("path" if "path" not in args else "copy")
            if "path" in args:  # a near copy of the quoted line: one digit, name or operator off
                assert (
                    args["old_string"] != inst.bug.old and inst.files(False)[inst.path].count(args["old_string"]) == 0
                )
        assert _play(inst, 0.5) == steps  # the same task, the same session
        assert _play(inst, 0.0) == [steps[0], ("edit", *right), steps[-1]]  # no slips without a rate
    assert kinds == {"path", "copy"} and set(counts) == {0, 1, 2}
