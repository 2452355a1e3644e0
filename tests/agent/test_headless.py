"""Headless `glm5 code -p` through the real CLI: what refused calls report, and the session commands."""

from __future__ import annotations

import json
import subprocess

import pytest
from typer.testing import CliRunner

from glm5cli.app import app
from tests.agent.fake_model import FakeModel, reply

runner = CliRunner()


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_CONFIG_DIR", str(tmp_path / "cfg"))
    for k in ("GLM5_BASE_URL", "GLM5_MODEL", "GLM5_PROVIDER"):
        monkeypatch.delenv(k, raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "a.txt").write_text("alpha\n")
    fake = FakeModel()
    yield repo, fake
    fake.close()


def code(repo, fake, *args):
    return runner.invoke(app, ["code", "--cwd", str(repo), "--base-url", fake.base_url, "--no-sandbox", *args])


def refusing_script():
    return [reply(tools=[("write", {"path": "b.txt", "content": "beta\n"}), ("read", {"path": "a.txt"})]),
            reply("could not write b.txt")]  # fmt: skip


def test_deny_json_lists_what_was_refused(env):
    repo, fake = env
    fake.script = refusing_script()
    r = code(repo, fake, "-p", "make b", "--output-format", "json", "--approval", "deny")
    assert r.exit_code == 4, r.output
    out = json.loads(r.stdout)
    assert out["is_error"] is True and out["exit_status"] == "submitted"
    assert [(d["tool"], d["decision"], d["arguments"]["path"]) for d in out["denied"]] == [("write", "denied", "b.txt")]
    assert "--approval deny" in out["denied"][0]["reason"]
    assert "glm5: refused write b.txt" in r.stderr and "1 tool call(s) were refused" in r.stderr
    assert not (repo / "b.txt").exists()


def test_deny_stream_json_tool_results_carry_the_decision(env):
    repo, fake = env
    fake.script = refusing_script()
    r = code(repo, fake, "-p", "make b", "--output-format", "stream-json")
    assert r.exit_code == 4, r.output
    events = [json.loads(line) for line in r.stdout.splitlines()]
    results = [e for e in events if e["type"] == "tool_result"]
    assert [e["decision"] for e in results] == ["denied", "allow"]
    assert "reason" in results[0] and "reason" not in results[1]
    assert events[-1]["type"] == "result" and len(events[-1]["denied"]) == 1
    assert "glm5: refused write" in r.stderr


def test_deny_rule_refusal_in_text_mode_goes_to_stderr(env):
    repo, fake = env
    fake.script = [reply(tools=[("bash", {"command": "git push origin main"})]), reply("not pushed")]
    r = code(repo, fake, "-p", "push", "--deny", "bash(git push)", "--approval", "auto")
    assert r.exit_code == 4
    assert "glm5: refused bash git push origin main: denied by rule bash(git push)" in r.stderr
    assert r.stdout.strip() == "not pushed"


def test_nothing_refused_is_exit_0_with_an_empty_list(env):
    repo, fake = env
    fake.script = [reply(tools=[("read", {"path": "a.txt"})]), reply("alpha")]
    r = code(repo, fake, "-p", "read a", "--output-format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["denied"] == [] and "refused" not in r.stderr
