"""Hooks get the event as JSON on stdin; exit 2 blocks and its stderr reaches the model."""

from __future__ import annotations

import json

from agent.trajectory import Trajectory
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


def write_settings(repo, text):
    (repo / ".glm5").mkdir(exist_ok=True)
    (repo / ".glm5" / "settings.toml").write_text(text)


def test_pre_tool_use_hook_blocks_a_call(repo, fake_model, tmp_path):
    seen = tmp_path / "seen.jsonl"
    hook = tmp_path / "guard.sh"
    hook.write_text(
        '#!/bin/bash\ninput=$(cat)\necho "$input" >> ' + str(seen) + "\n"
        "if echo \"$input\" | grep -q 'rm -rf'; then echo 'no recursive deletes, use git clean' >&2; exit 2; fi\n"
    )
    hook.chmod(0o755)
    write_settings(
        repo,
        f'[hooks]\nPreToolUse = [{{ matcher = "bash", command = "{hook}" }}]\n'
        f'PostToolUse = [{{ matcher = "write|edit", command = "echo formatted >&2; exit 2" }}]\n'
        f"UserPromptSubmit = [{{ command = \"echo 'branch: main'\" }}]\n"
        f"SessionStart = [{{ command = \"echo 'hook says hello'\" }}]\n",
    )
    fake_model.script = [
        reply(tools=[("bash", {"command": "rm -rf build"})]),
        reply(tools=[("bash", {"command": "echo fine > fine.txt"}), ("write", {"path": "w.txt", "content": "w"})]),
        reply("done"),
    ]
    s = make_session(repo, fake_model, flags={"mode": "auto"})
    assert "hook says hello" in s.agent.messages[0]["content"]
    s.agent.run("clean up")
    s.close()
    msgs = fake_model.requests[1]["messages"]
    assert "<hook-context>\nbranch: main" in msgs[1]["content"]
    assert "blocked by a PreToolUse hook: no recursive deletes, use git clean" in msgs[-1]["content"]
    last = fake_model.requests[2]["messages"]
    assert (repo / "fine.txt").exists()
    assert "[PostToolUse hook] formatted" in last[-1]["content"] and "[PostToolUse" not in last[-2]["content"]
    events = [json.loads(line) for line in seen.read_text().splitlines()]
    assert events[0]["hook_event_name"] == "PreToolUse" and events[0]["tool_input"] == {"command": "rm -rf build"}
    assert events[0]["session_id"] == s.id
    recs = [r for r in Trajectory.load(s.path).records if r["type"] == "tool"]
    assert recs[0]["decision"] == "blocked"


def test_stop_hook_sends_the_agent_back_and_prompt_hook_blocks(repo, fake_model, tmp_path):
    flag = tmp_path / "stopped_once"
    write_settings(
        repo,
        "[hooks]\n"
        f"Stop = [{{ command = \"grep -q 'stop_hook_active.: true' || {{ touch {flag}; echo run the tests first >&2; exit 2; }}\" }}]\n"
        'UserPromptSubmit = [{ command = "grep -q forbidden && { echo not allowed >&2; exit 2; } || true" }]\n',
    )
    fake_model.script = [reply("done early"), reply("tests run, done")]
    s = make_session(repo, fake_model)
    res = s.agent.run("do it")
    assert res.final == "tests run, done"
    assert fake_model.requests[1]["messages"][-1]["content"] == "[Stop hook] run the tests first"
    res = s.agent.run("something forbidden")
    assert res.exit_status == "blocked" and res.final == "not allowed" and len(fake_model.requests) == 2
    s.close()
