"""The interactive built-in terminal tasks solved by the glm5 agent through its terminal tools, with a scripted
endpoint that sends the keystrokes a model would, each after reading the screen: an installer that only runs in
a terminal (and discards answers typed ahead), a crash examined in pdb's post-mortem, then fixed, and commits
squashed in `git rebase -i` by driving its editor."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from agent.bench.agents import AgentLimits, make_agent
from agent.bench.repos import RepoCache
from agent.bench.tasks import load_terminal_task
from agent.bench.trial import TrialConfig, run_trial
from agent.sandbox import probe
from agent.trajectory import Trajectory
from plugins.bench_suites.terminal_suite import TerminalSuite
from tests.agent.fake_model import reply

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return {p.name: p for p in TerminalSuite().materialize(tmp_path_factory.mktemp("suite"))}


def _trial(tmp_path, task_dir, fake_model, script, profile=None):
    fake_model.script = script
    agent = make_agent("glm5", base_url=fake_model.base_url, model="fake", profile=profile)
    cfg = TrialConfig(cache_dir=tmp_path / "cache", repos=RepoCache(tmp_path / "cache"),
                      limits=AgentLimits(max_turns=12))  # fmt: skip
    r = run_trial(load_terminal_task(task_dir), agent, tmp_path / "g", cfg)
    tools = [rec for rec in Trajectory.load(tmp_path / "g" / "trajectory.jsonl").records if rec["type"] == "tool"]
    return r, tools


def _last_screen(body) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")


def _send(session, text, wait_for):
    return reply(tools=[("terminal_send", {"session": session, "input": [text, "<Enter>"], "wait_for": wait_for,
                                               "timeout": 60})])


@pytest.mark.parametrize("profile", ["full", "compact"])
def test_glm5_answers_the_installer_in_a_terminal(tmp_path, suite, fake_model, profile):
    r, tools = _trial(tmp_path, suite["installer-prompts"], fake_model, [
        reply(tools=[("terminal_open", {"session": "main"})]),
        _send("main", "python3 /app/install.py", r"^Project name:$"),
        _send("main", "orchard-api", r"^Choose a database \[1-3\]:$"),
        _send("main", "2", r"^Port \[8080\]:$"),
        _send("main", "5433", r"\[y/N\]:$"),
        _send("main", "y", r"^wrote /app/app.conf"),
        reply("Installed."),
    ], profile=profile)  # fmt: skip
    assert r.status == "resolved" and r.reward == 1.0, r.reason
    offered = {t["function"]["name"] for t in fake_model.requests[0]["tools"]}
    # `glm5 bench terminal` gives the agent the terminal tools in either profile
    assert {"terminal_open", "terminal_send", "terminal_read", "terminal_close"} <= offered
    assert ("grep" in offered) == (profile == "full")
    assert [t["name"] for t in tools] == ["terminal_open"] + ["terminal_send"] * 5
    assert all(t["decision"] == "allow" and not t["is_error"] for t in tools)
    assert "orchard installer 1.0" in tools[1]["result"] and "install id 8bc3e9f72bc3309f" in tools[-1]["result"]


def test_answers_typed_ahead_are_lost_and_the_task_fails(tmp_path, suite, fake_model):
    # all four answers at once, before the questions: the installer flushes them (the task needs the terminal)
    r, _ = _trial(tmp_path, suite["installer-prompts"], fake_model, [
        reply(tools=[("terminal_open", {"session": "main", "command": "python3 /app/install.py"})]),
        reply(tools=[("terminal_send", {"session": "main", "input": ["orchard-api\n2\n5433\ny\n"], "timeout": 2})]),
        reply("Installed."),
    ])  # fmt: skip
    assert r.status != "resolved" and r.reward == 0.0


def test_glm5_reads_a_value_in_pdb_and_fixes_the_crash(tmp_path, suite, fake_model):
    def answer(body):
        screen = _last_screen(body)
        key = re.search(r"^\(Pdb\) p key\n(\d+)$", screen, re.M).group(1)  # read off the debugger's screen
        return reply(tools=[("bash", {"command": f"echo {key} > /app/answer.txt"})])

    r, tools = _trial(tmp_path, suite["debug-crash"], fake_model, [
        reply(tools=[("terminal_open", {"session": "dbg", "command": "python3 -m pdb /app/ledger.py", "rows": 40})]),
        _send("dbg", "continue", r"post mortem debugging"),
        _send("dbg", "p key", r"^\(Pdb\) p key\n\d+$"),
        answer,
        reply(tools=[("terminal_close", {"session": "dbg"})]),
        reply(tools=[("read", {"path": "/app/ledger.py"})]),
        reply(tools=[("edit", {"path": "/app/ledger.py", "old_string": "weight = key % 89 - 7\n",
                               "new_string": "weight = key % 89 - 7 or 1\n"})]),
        reply("Fixed."),
    ])  # fmt: skip
    assert r.status == "resolved" and r.reward == 1.0, r.reason
    assert "ZeroDivisionError" in tools[1]["result"] and "312664" in tools[2]["result"]
    assert json.dumps(tools[3]["arguments"]).count("312664") == 1


@pytest.mark.skipif(shutil.which("vi") is None, reason="git's default editor, vi, is not installed")
def test_glm5_squashes_commits_in_git_rebase_i_driving_the_editor(tmp_path, suite, fake_model):
    def keys(*items, wait_for):
        return reply(tools=[("terminal_send", {"session": "git", "input": list(items), "wait_for": wait_for,
                                                   "timeout": 60})])

    r, tools = _trial(tmp_path, suite["rebase-squash"], fake_model, [
        reply(tools=[("terminal_open", {"session": "git", "rows": 30})]),
        keys("cd /app/repo && git config user.name Dev && git config user.email dev@example.com\n", wait_for=r"^\$$"),
        keys("git rebase -i HEAD~3\n", wait_for=r"^pick \w+ wip: fix"),  # the todo list, in vi
        keys(":2,3s/^pick/squash/", "<Enter>", ":wq", "<Enter>", wait_for="This is a combination of 3 commits"),
        keys(":%d", "<Enter>", "i", "Add number parsing", "<Esc>", ":wq", "<Enter>", wait_for="Successfully rebased"),
        reply("Squashed."),
    ])  # fmt: skip
    assert r.status == "resolved" and r.reward == 1.0, r.reason
    assert "pick" in tools[2]["result"] and "This is a combination of 3 commits" in tools[3]["result"]
    assert "Successfully rebased" in tools[4]["result"]
    assert all(t["decision"] == "allow" for t in tools)
