"""Approvals: the request shows what the call would do; "no" can carry a message for the model; "always"
allows the narrowest rule (or the user's edit of it) and can save it to the settings."""

from __future__ import annotations

import sys

import pytest

from agent.approval import proposed_rule
from agent.trajectory import Trajectory
from agent.ui import ALWAYS, NO, Answer
from tests.agent.fake_model import reply
from tests.agent.helpers import RecordingUI, make_session


def test_edit_request_carries_the_diff_and_bash_the_full_command(repo, fake_model):
    long_cmd = "touch " + "x" * 200 + " && make build-" + "y" * 200
    fake_model.script = [
        reply(tools=[("read", {"path": "calc.py"})]),
        reply(
            tools=[
                ("edit", {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}),
                ("bash", {"command": long_cmd}),
            ]
        ),  # fmt: skip
        reply("ok"),
    ]
    ui = RecordingUI(answers=[NO, NO])
    s = make_session(repo, fake_model, ui)
    s.agent.run("fix")
    s.close()
    edit, bash = ui.requests
    assert "-    return a - b" in edit.preview and "+    return a + b" in edit.preview
    assert bash.preview == long_cmd
    assert edit.suggested_rule == "edit(calc.py)"  # this file, not every edit
    assert (repo / "calc.py").read_text().endswith("a - b\n")  # the preview wrote nothing


def test_no_with_a_message_goes_back_to_the_model(repo, fake_model):
    fake_model.script = [reply(tools=[("bash", {"command": "rm -rf build"})]), reply("ok, I will not")]
    s = make_session(repo, fake_model, RecordingUI(answers=[Answer(NO, message="use make clean instead")]))
    s.agent.run("clean up")
    s.close()
    tool_msg = [m for m in fake_model.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "the user declined" in tool_msg and "The user says: use make clean instead" in tool_msg
    rec = [r for r in Trajectory.load(s.path).records if r["type"] == "tool"][0]
    assert rec["decision"] == "denied" and rec["user_message"] == "use make clean instead"


def test_always_allows_the_narrowest_rule_only(repo, fake_model):
    pytest_cmd = f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py"
    other = f"{sys.executable} -c 'print(1)'"
    fake_model.script = [reply(tools=[("bash", {"command": pytest_cmd})]), reply(tools=[("bash", {"command": pytest_cmd})]),
                         reply(tools=[("bash", {"command": other})]), reply("done")]  # fmt: skip
    ui = RecordingUI(answers=[ALWAYS, NO])
    s = make_session(repo, fake_model, ui)
    s.agent.run("test")
    s.close()
    # asked for the first pytest run and for the other python command, not for the second pytest run
    assert [r.subject for r in ui.requests] == [pytest_cmd, other]
    rule = ui.requests[0].suggested_rule
    assert rule.startswith("bash(") and "pytest" in rule, rule
    recs = [r for r in Trajectory.load(s.path).records if r["type"] == "permission_rule"]
    assert recs == [{**recs[0], "rule": rule, "kind": "allow", "scope": "session"}]


def test_always_with_an_edited_rule(repo, fake_model):
    fake_model.script = [reply(tools=[("bash", {"command": "touch a.txt"})]),
                         reply(tools=[("bash", {"command": "touch b.txt"})]), reply("done")]  # fmt: skip
    ui = RecordingUI(answers=[Answer(ALWAYS, rule="bash(touch:*)")])
    s = make_session(repo, fake_model, ui)
    s.agent.run("touch")
    s.close()
    assert len(ui.requests) == 1 and (repo / "b.txt").exists()


def test_proposed_rule_for_python_module_runs():
    assert proposed_rule("bash", "execute", "python -m pytest -q") == "bash(python -m pytest:*)"


@pytest.mark.parametrize("scope", ["repo", "user"])
def test_always_saved_to_settings_holds_in_the_next_session(repo, fake_model, scope):
    fake_model.script = [reply(tools=[("bash", {"command": "touch a.txt"})]), reply("done")]
    s = make_session(repo, fake_model, RecordingUI(answers=[Answer(ALWAYS, rule="bash(touch:*)", save=scope)]))
    s.agent.run("touch")
    s.close()
    fake_model.script = [reply(tools=[("bash", {"command": "touch b.txt"})]), reply("done")]
    ui = RecordingUI(answers=[NO])
    s = make_session(repo, fake_model, ui)
    s.agent.run("touch again")
    s.close()
    assert ui.requests == [] and (repo / "b.txt").exists()


def test_an_edit_that_cannot_run_is_refused_before_the_user_is_asked(repo, fake_model):
    # the report: the TUI showed the diff of an edit to a file not yet read, asked, and after `y` the edit failed
    fake_model.script = [
        reply(tools=[("edit", {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"})]),
        reply(tools=[("edit", {"path": "nope.py", "old_string": "x", "new_string": "y"})]),
        reply(tools=[("write", {"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"})]),
        reply(tools=[("read", {"path": "calc.py"})]),
        reply(tools=[("edit", {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"})]),
        reply("done"),
    ]
    ui = RecordingUI(answers=[NO])
    s = make_session(repo, fake_model, ui)
    s.agent.run("fix")
    s.close()
    assert [r.tool for r in ui.requests] == ["edit"] and "a + b" in ui.requests[0].preview  # only the read-first edit
    tools = [r for r in Trajectory.load(s.path).records if r["type"] == "tool"]
    said = ("read calc.py before changing it", "nope.py does not exist", "read calc.py before changing it")
    for rec, why in zip(tools[:3], said, strict=True):
        assert rec["decision"] == "unasked" and rec["failed"] == "call" and why in rec["result"], rec
    assert tools[4]["decision"] == "denied"
    assert (repo / "calc.py").read_text().endswith("a - b\n")
