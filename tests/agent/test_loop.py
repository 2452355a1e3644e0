"""The loop end to end against the scripted endpoint, on a real git repository."""

from __future__ import annotations

import json
import sys

import pytest

from agent.loop import LIMITS, SUBMITTED
from agent.trajectory import Trajectory
from agent.ui import NO
from tests.agent.conftest import git
from tests.agent.fake_model import reply
from tests.agent.helpers import RecordingUI, make_session

PYTEST = f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py"


def fix_script():
    return [
        reply(reasoning="The add function looks wrong; read it.", tools=[("read", {"path": "calc.py"})]),
        reply(
            "Fixing the operator.",
            tools=[("edit", {"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"})],
        ),  # fmt: skip
        reply(tools=[("bash", {"command": PYTEST})]),
        reply("Fixed `add`: it subtracted; the test passes now."),
    ]


def test_multi_step_fix_with_edit_and_test_run(repo, fake_model):
    fake_model.script = fix_script()
    ui = RecordingUI()
    s = make_session(repo, fake_model, ui)
    res = s.agent.run("make the test pass")
    s.agent.finish(res.exit_status, res.final)
    s.close()

    assert res.exit_status == SUBMITTED and "test passes" in res.final
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    # ask mode asked before the edit and the command, not before the read
    assert [r.tool for r in ui.requests] == ["edit", "bash"]
    # the model got the tool schemas and the reasoning streamed through
    assert {t["function"]["name"] for t in fake_model.requests[0]["tools"]} >= {"read", "write", "edit", "glob",
                                                                               "grep", "bash", "todo"}  # fmt: skip
    assert any(k == "reasoning" for k, _ in ui.deltas)
    # the request after the read carries the tool result with numbered lines
    tool_msgs = [m for m in fake_model.requests[1]["messages"] if m["role"] == "tool"]
    assert "return a - b" in tool_msgs[-1]["content"]
    # the user's branch and index are untouched: nothing staged, HEAD unchanged
    assert git(repo, "diff", "--cached", "--name-only") == ""
    assert git(repo, "log", "--oneline").count("\n") == 1

    t = Trajectory.load(s.path)
    assert t.header["schema"] == "glm5-trajectory/1" and t.header["model"] == "fake-glm"
    msgs = t.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant",
                                         "tool", "assistant"]  # fmt: skip
    assert msgs[2]["reasoning_content"].startswith("The add function")
    assert json.loads(msgs[4]["tool_calls"][0]["function"]["arguments"])["new_string"] == "return a + b"
    tools = [r for r in t.records if r["type"] == "tool"]
    edit = tools[1]
    assert edit["name"] == "edit" and edit["decision"] == "approved"
    assert edit["commit_before"] != edit["commit_after"]
    assert "+    return a + b" in edit["data"]["diff"]
    assert tools[0]["commit_before"] is None  # reads take no checkpoint
    out = t.outcome()
    assert [{k: t[k] for k in ("command", "returncode", "passed", "status")} for t in out["tests"]] == [
        {"command": PYTEST, "returncode": 0, "passed": True, "status": "passed"}
    ]
    assert "1 passed" in out["tests"][0]["evidence"]
    assert out["tests_passed"] is True and out["diff_kept"] is True, out
    assert out["files_changed"] == ["calc.py"]
    assert t.end()["exit_status"] == SUBMITTED
    samples = list(t.samples())
    assert len(samples) == 4 and samples[1]["messages"][-1]["role"] == "tool"
    assert samples[0]["response"]["reasoning_content"]


def test_denied_command_is_reported_to_the_model_and_not_run(repo, fake_model):
    fake_model.script = [
        reply(tools=[("bash", {"command": "touch created_by_agent"})]),
        reply(tools=[("bash", {"command": "git push origin main"})]),
        reply("I could not run it."),
    ]
    s = make_session(repo, fake_model, RecordingUI(answers=[NO]), flags={"deny": ("bash(git push)",)})
    res = s.agent.run("make a file")
    s.close()
    assert res.exit_status == SUBMITTED
    assert not (repo / "created_by_agent").exists()
    tool_msgs = [m for m in fake_model.requests[2]["messages"] if m["role"] == "tool"]
    assert "permission denied: the user declined" in tool_msgs[0]["content"]
    assert "denied by rule bash(git push)" in tool_msgs[1]["content"]
    recs = [r for r in Trajectory.load(s.path).records if r["type"] == "tool"]
    assert [r["decision"] for r in recs] == ["denied", "denied"]


def test_plan_mode_refuses_edits_but_runs_read_only_commands(repo, fake_model):
    fake_model.script = [
        reply(
            tools=[
                ("read", {"path": "calc.py"}),
                ("bash", {"command": "git status --short && ls"}),
                ("write", {"path": "new.txt", "content": "x"}),
            ]
        ),  # fmt: skip
        reply("plan: change - to +"),
    ]
    ui = RecordingUI()
    s = make_session(repo, fake_model, ui, flags={"mode": "plan"})
    s.agent.run("plan it")
    s.close()
    assert ui.requests == [] and not (repo / "new.txt").exists()
    tool_msgs = [m["content"] for m in fake_model.requests[1]["messages"] if m["role"] == "tool"]
    assert "calc.py" in tool_msgs[1] and "plan mode is read-only" in tool_msgs[2]


def test_step_limit_and_format_errors(repo, fake_model):
    fake_model.script = [reply(tools=[("glob", {"pattern": "*.py"})]) for _ in range(5)]
    s = make_session(repo, fake_model, flags={"max_turns": 2})
    res = s.agent.run("loop forever")
    assert res.exit_status == LIMITS and len(fake_model.requests) == 2
    s.close()

    fake_model.script = [reply(tools=[("nope", {})]), reply(tools=[("read", {})], raw_args="{bad json"),
                         reply(tools=[("nope", {})])]  # fmt: skip
    s = make_session(repo, fake_model)
    res = s.agent.run("be malformed")
    assert res.exit_status == "format_error"
    last = fake_model.requests[-1]["messages"]
    assert "no tool named 'nope'" in last[-3]["content"] and "not valid JSON" in last[-1]["content"]
    recs = [r for r in Trajectory.load(s.path).records if r["type"] == "tool"]
    assert [r["decision"] for r in recs] == ["format_error"] * 3 and recs[1]["arguments"] == "{bad json"
    s.close()


def test_a_call_the_tool_refuses_is_recorded_as_failed_and_a_failing_command_is_not(repo, fake_model):
    # The record tells training data apart: a refused call is the model's mistake (SFT masks it), a command
    # that ran and exited nonzero is not.
    fake_model.script = [
        reply(tools=[("read", {"path": "calc.py"})]),
        reply(tools=[("edit", {"path": "calc.py", "old_string": "return a * b", "new_string": "return a + b"})]),
        reply(tools=[("edit", {"old_string": "return a - b", "new_string": "return a + b"})]),
        reply(tools=[("bash", {"command": PYTEST})]),
        reply("The test still fails."),
    ]  # fmt: skip
    ui = RecordingUI()
    s = make_session(repo, fake_model, ui)  # ask mode; the UI says yes
    s.agent.run("fix add")
    s.close()
    recs = [r for r in Trajectory.load(s.path).records if r["type"] == "tool"]
    assert [r["name"] for r in recs] == ["read", "edit", "edit", "bash"]
    assert [r.tool for r in ui.requests] == ["edit", "bash"]  # asked for the edit with its path only
    assert [r.get("failed") for r in recs] == [None, "call", None, None]
    assert "old_string was not found" in recs[1]["result"]
    # a call without a required argument is malformed: refused before anyone is asked
    assert recs[2]["decision"] == "format_error" and "missing required argument `path`" in recs[2]["result"]
    assert recs[3]["is_error"] and "failed" in recs[3]["result"]  # the test ran and failed: not a failed call


def test_crash_mid_step_leaves_a_readable_trajectory(repo, fake_model):
    class Boom(Exception):
        pass

    def explode(body):
        raise Boom  # noqa: RSE102

    fake_model.script = [reply(tools=[("read", {"path": "calc.py"})])]
    s = make_session(repo, fake_model)
    s.agent.model.sleep = lambda _: None
    calls = {"n": 0}
    real_run = s.agent.tools.get("edit").run

    orig_query = s.agent.model.query

    def query(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("process died here")
        return orig_query(*a, **k)

    s.agent.model.query = query
    try:
        s.agent.run("crash")
    except RuntimeError:
        pass
    assert real_run  # the session object is still usable
    # simulate a torn last line from a kill during a write
    with open(s.path, "a") as f:
        f.write('{"type": "message", "index": 9, "mess')
    t = Trajectory.load(s.path)
    assert [m["role"] for m in t.messages()] == ["system", "user", "assistant", "tool"]
    assert t.end() is None


def test_secrets_never_reach_the_trajectory(repo, fake_model, monkeypatch):
    monkeypatch.setenv("DEPLOY_TOKEN", "tok-very-secret-value-123")
    # the child's environment is scrubbed of secrets, so the value reaches the output through a file
    (repo / "notes.txt").write_text("token tok-very-secret-value-123\n")
    fake_model.script = [
        reply(tools=[("bash", {"command": "cat notes.txt; echo sk-abcdefghijklmnopqrstuvwxyz123456"})]),
        reply("printed them"),
    ]
    s = make_session(repo, fake_model, flags={"mode": "auto"})
    s.agent.run("print the token")
    s.close()
    # the model saw the real output (it is the user's machine); the record on disk does not keep it
    assert "tok-very-secret-value-123" in fake_model.requests[1]["messages"][-1]["content"]
    text = s.path.read_text()
    assert "tok-very-secret-value-123" not in text and "sk-abcdefghij" not in text and "[REDACTED]" in text


def test_reasoning_is_sent_back_unless_turned_off(repo, fake_model):
    for send, expect in ((True, True), (False, False)):
        (repo / ".glm5").mkdir(exist_ok=True)
        (repo / ".glm5" / "settings.toml").write_text(f"[agent]\nsend_reasoning = {str(send).lower()}\n")
        fake_model.script = [reply(reasoning="hmm", tools=[("glob", {"pattern": "*.py"})]), reply("ok")]
        s = make_session(repo, fake_model)
        s.agent.run("go")
        s.close()
        sent = fake_model.requests[-1]["messages"][2]
        assert sent["role"] == "assistant" and ("reasoning_content" in sent) is expect
        assert s.agent.messages[2]["reasoning_content"] == "hmm"  # the record keeps it either way


def test_token_cost_and_wall_time_limits(repo, fake_model):
    from agent.settings import Limits

    for limits, why in (
        (Limits(max_tokens=150), "token limit"),  # each call here uses 120 tokens
        (Limits(max_cost_usd=0.0001), "cost limit"),
        (Limits(max_wall_s=0.0), "wall-time limit"),
    ):
        fake_model.script = [reply(tools=[("glob", {"pattern": "*.py"})]) for _ in range(3)]
        s = make_session(repo, fake_model)
        s.agent.config.limits = limits
        s.agent.config.input_cost_per_mtok = 1000.0  # $0.1 per 100 prompt tokens
        res = s.agent.run("go")
        s.close()
        assert res.exit_status == LIMITS and why in res.final, (why, res)


def test_a_tool_schema_with_odd_required_neither_crashes_nor_refuses():
    # an MCP server's inputSchema is the server's to write: a `required` that is not a list of names is ignored
    from types import SimpleNamespace

    from agent.flow import FormatError
    from agent.tool_call import parse

    def agent_with(required):
        tool = SimpleNamespace(parameters={"type": "object", "required": required})
        return SimpleNamespace(tools=SimpleNamespace(get=lambda name: tool, names=lambda: ["t"]))

    call = {"function": {"name": "t", "arguments": json.dumps({"a": 1})}}
    for odd in ("path", 5, None, [3, None], {"a": 1}):
        assert parse(agent_with(odd), call)[2] == {"a": 1}
    with pytest.raises(FormatError, match="missing required argument `b`"):
        parse(agent_with(["a", "b"]), call)
