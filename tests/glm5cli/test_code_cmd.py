"""`glm5 code -p`: headless runs, output formats and exit codes, through the real CLI against the fake endpoint."""

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
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("alpha\n")
    fake = FakeModel()
    yield repo, fake
    fake.close()


def code(repo, fake, *args):
    return runner.invoke(app, ["code", "--cwd", str(repo), "--base-url", fake.base_url, "--no-sandbox", *args])


def test_text_output_and_success_exit(env):
    repo, fake = env
    fake.script = [reply(tools=[("read", {"path": "a.txt"})]), reply("The file says alpha.")]
    r = code(repo, fake, "-p", "what is in a.txt?")
    assert r.exit_code == 0, r.output
    assert "The file says alpha." in r.stdout


def test_json_output(env):
    repo, fake = env
    fake.script = [reply("done")]
    r = code(repo, fake, "-p", "hi", "--output-format", "json")
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["type"] == "result" and out["exit_status"] == "submitted" and out["result"] == "done"
    assert out["stats"]["prompt_tokens"] == 100 and out["session_id"] and out["is_error"] is False


def test_stream_json_events_and_approval_auto(env):
    repo, fake = env
    fake.script = [reply(tools=[("write", {"path": "b.txt", "content": "beta\n"})], reasoning="write it"), reply("ok")]
    r = code(repo, fake, "-p", "make b", "--output-format", "stream-json", "--approval", "auto")
    assert r.exit_code == 0, r.output
    events = [json.loads(line) for line in r.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "init" and types[-1] == "result"
    assert "tool_use" in types and "tool_result" in types
    assert any(e.get("reasoning_content") == "write it" for e in events)
    assert (repo / "b.txt").read_text() == "beta\n"


def test_approval_deny_refuses_edits(env):
    repo, fake = env
    fake.script = [reply(tools=[("write", {"path": "b.txt", "content": "beta\n"})]), reply("could not")]
    r = code(repo, fake, "-p", "make b")
    assert r.exit_code == 4 and not (repo / "b.txt").exists()  # done, but a call was refused


def test_limit_reached_exit_code(env):
    repo, fake = env
    fake.script = [reply(tools=[("glob", {"pattern": "*"})])] * 5
    r = code(repo, fake, "-p", "loop", "--max-turns", "2", "--output-format", "json")
    assert r.exit_code == 3
    assert json.loads(r.stdout)["exit_status"] == "limits_exceeded"


def test_endpoint_error_exit_code(env):
    repo, fake = env
    fake.script = [{"status": 401, "message": "bad key"}]
    r = code(repo, fake, "-p", "hi")
    assert r.exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["-p", "x", "--output-format", "yaml"],
        ["-p", "x", "--approval", "maybe"],
        ["-p", "   "],
        ["-p", "x", "--resume", "no-such-session"],
        ["-p", "x", "stray-argument"],
        ["-p", "x", "--mode", "yolo"],
    ],
)
def test_bad_input_exit_code(env, args):
    repo, fake = env
    r = code(repo, fake, *args)
    assert r.exit_code == 2, r.output


def test_resume_latest_without_id(env):
    repo, fake = env
    fake.script = [reply("first")]
    assert code(repo, fake, "-p", "remember 7").exit_code == 0
    fake.script = [reply("second")]
    r = code(repo, fake, "-p", "which number?", "--output-format", "json", "--resume")
    assert r.exit_code == 0, r.output
    contents = [m.get("content") for m in fake.requests[-1]["messages"]]
    assert "remember 7" in contents and "which number?" in contents


def test_task_piped_on_stdin_runs_headless(env):
    repo, fake = env
    fake.script = [reply("piped ok")]
    r = runner.invoke(app, ["code", "--cwd", str(repo), "--base-url", fake.base_url, "--no-sandbox"],
                      input="do the piped thing\n")  # fmt: skip
    assert r.exit_code == 0 and "piped ok" in r.stdout
    assert fake.requests[0]["messages"][1]["content"] == "do the piped thing\n"


def test_outside_a_git_repository_it_runs_without_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_CONFIG_DIR", str(tmp_path / "cfg"))
    plain = tmp_path / "plain"
    plain.mkdir()
    fake = FakeModel([reply(tools=[("bash", {"command": "echo x > x.txt"})]), reply("done")])
    try:
        r = runner.invoke(app, ["code", "--cwd", str(plain), "--base-url", fake.base_url, "--no-sandbox", "-p", "go",
                                "--approval", "auto"])  # fmt: skip
    finally:
        fake.close()
    assert r.exit_code == 0 and (plain / "x.txt").exists()
    assert "not in a git repository" in r.stderr
