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


def test_a_malformed_call_is_said_on_stderr_and_is_not_a_refusal_and_no_escape_code_gets_through(env):
    repo, fake = env
    fake.script = [reply(tools=[("read", {"file_path": "a.txt"})]), reply(tools=[("read", {"path": "a.txt"})]),
                   reply("alpha")]  # fmt: skip
    r = code(repo, fake, "-p", "read a", "--output-format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["denied"] == [], r.output
    assert "glm5: malformed read call, not run: missing required argument `path`" in r.stderr
    fake.script = [reply(tools=[("\x1b]0;owned\x07", {})]), reply("done")]  # a name with terminal escape codes
    r = code(repo, fake, "-p", "x")
    assert r.exit_code == 0 and "\x1b" not in r.stderr and "malformed \\x1b]0;owned\\x07 call" in r.stderr
    fake.script = [reply(tools=[("bash", {"command": "touch \x1b[2J"})]), reply("done")]  # refused: said, escaped
    r = code(repo, fake, "-p", "x", "--approval", "deny")
    assert r.exit_code == 4 and "\x1b" not in r.stderr and "glm5: refused bash touch \\x1b[2J" in r.stderr


def test_nothing_refused_is_exit_0_with_an_empty_list(env):
    repo, fake = env
    fake.script = [reply(tools=[("read", {"path": "a.txt"})]), reply("alpha")]
    r = code(repo, fake, "-p", "read a", "--output-format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["denied"] == [] and "refused" not in r.stderr


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_diff_undo_and_rewind_work_headless_on_the_latest_or_a_named_session(env):
    repo, fake = env
    fake.script = [reply(tools=[("write", {"path": "b.txt", "content": "beta\n"})]), reply("made b")]
    assert code(repo, fake, "-p", "make b", "--approval", "auto").exit_code == 0
    fake.script = [reply(tools=[("write", {"path": "c.txt", "content": "gamma\n"})]), reply("made c")]
    r = code(repo, fake, "-p", "make c", "--approval", "auto", "--continue", "--output-format", "json")
    sid = json.loads(r.stdout)["session_id"]
    n_requests = len(fake.requests)

    r = code(repo, fake, "--diff")
    assert r.exit_code == 0, r.output
    assert "+++ b/b.txt" in r.stdout and "+++ b/c.txt" in r.stdout and "+beta" in r.stdout
    r = code(repo, fake, "--rewind", "0")  # one numbering: N of the list, and the turn it undoes, in CLI words
    assert r.exit_code == 0 and "glm5 code --rewind N undoes the last N turns" in r.stdout and "/rewind" not in r.stdout
    assert "1: turn 2 (the latest): 'make c'" in r.stdout and "2: turn 1: 'make b'" in r.stdout

    r = code(repo, fake, "--undo", "--output-format", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["session_id"] == sid and "undid the latest turn (turn 2)" in out["result"]
    assert (repo / "b.txt").exists() and not (repo / "c.txt").exists()

    other = code(repo, fake, "-p", "hello")  # a newer session: `--undo SID` must still find the first one
    assert other.exit_code == 0
    r = code(repo, fake, "--undo", sid)
    assert r.exit_code == 0, r.output
    assert not (repo / "b.txt").exists()
    r = code(repo, fake, "--undo", sid)
    assert r.exit_code == 2 and "nothing to undo" in r.stderr
    r = code(repo, fake, "--diff", sid)
    assert r.exit_code == 0 and "changed nothing" in r.stdout
    # none of these called the model, and the undone conversation is what a resume continues from
    assert len(fake.requests) == n_requests + 1
    fake.script = [reply("fresh")]
    assert code(repo, fake, "-p", "again", "--resume", sid).exit_code == 0
    assert [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "user"] == ["again"]


def test_print_slash_undo_runs_the_command_not_a_task(env):
    repo, fake = env
    fake.script = [reply(tools=[("write", {"path": "b.txt", "content": "beta\n"})]), reply("made b")]
    assert code(repo, fake, "-p", "make b", "--approval", "auto").exit_code == 0
    n = len(fake.requests)
    r = code(repo, fake, "-p", "/undo")
    assert r.exit_code == 0 and "undid the latest turn (turn 1)" in r.stdout and not (repo / "b.txt").exists()
    assert len(fake.requests) == n  # the model never saw "/undo"


def test_rewind_out_of_range_and_mixed_flags_are_bad_input(env):
    repo, fake = env
    fake.script = [reply("hi")]
    assert code(repo, fake, "-p", "one").exit_code == 0
    r = code(repo, fake, "--rewind", "5")
    assert r.exit_code == 2 and "can rewind 1..1 turns, not 5" in r.stderr
    assert code(repo, fake, "--undo", "--diff").exit_code == 2
    assert code(repo, fake, "--undo", "-p", "x").exit_code == 2


def test_unreachable_local_endpoint_names_where_the_url_came_from(env, monkeypatch):
    repo, _ = env
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    base = ["code", "--cwd", str(repo), "--no-sandbox", "-p", "hi"]

    r = runner.invoke(app, [*base, "--base-url", url])
    assert r.exit_code == 1 and f"no model server at {url}" in r.stderr and "--base-url flag" in r.stderr
    assert r.stderr.count("refused") == 1  # one line said once, no retries

    monkeypatch.setenv("GLM5_BASE_URL", url)
    r = runner.invoke(app, base)
    assert r.exit_code == 1 and "$GLM5_BASE_URL" in r.stderr
    monkeypatch.delenv("GLM5_BASE_URL")

    cfg = repo.parent / "cfg"
    cfg.mkdir(exist_ok=True)
    (cfg / "config.toml").write_text(f'[providers.local]\nbase_url = "{url}"\n')
    r = runner.invoke(app, base)
    said = " ".join(r.stderr.split())  # rich wraps long lines
    assert r.exit_code == 1 and f"[providers.local] base_url in {cfg / 'config.toml'}" in said, said
    assert f"glm5 serve CHECKPOINT --port {port}" in said
    assert not list(repo.glob(".glm5/sessions/*.jsonl"))  # failed before a session was made


def test_endpoint_origin_of_the_builtin_default(tmp_path, monkeypatch):
    from agent.endpoint import origin
    from agent.settings import load_settings

    monkeypatch.setenv("GLM5_CONFIG_DIR", str(tmp_path))
    monkeypatch.delenv("GLM5_BASE_URL", raising=False)
    s = load_settings(tmp_path, {})
    assert "built-in provider 'local'" in origin(s) and s.provider.base_url == "http://127.0.0.1:8000/v1"


def test_a_refused_key_is_said_once_and_names_the_variable(env, monkeypatch):
    # the report: the 401 printed twice, then "glm5: error", with no word of GLM5_API_KEY / --api-key-env
    repo, fake = env
    monkeypatch.delenv("GLM5_API_KEY", raising=False)
    fake.script = [{"status": 401, "message": "missing or invalid API key"}]
    r = code(repo, fake, "-p", "hi")
    assert r.exit_code == 1
    assert r.output.count("401") == 1, r.output
    assert "GLM5_API_KEY is not set" in r.output and "--api-key-env" in r.output, r.output
    monkeypatch.setenv("MY_KEY", "wrong")
    fake.script = [{"status": 401, "message": "invalid API key"}]
    r = code(repo, fake, "-p", "hi", "--api-key-env", "MY_KEY", "--output-format", "json")
    assert r.exit_code == 1 and "MY_KEY holds a key the endpoint refused" in json.loads(r.stdout)["result"]


def test_a_reply_of_reasoning_only_says_no_answer_was_given(env):
    repo, fake = env
    fake.script = [reply("", reasoning="let me think about it at length")]
    r = code(repo, fake, "-p", "hi")
    assert r.exit_code == 0 and r.stdout == ""
    assert "ended without an answer" in r.stderr and "reasoning only" in r.stderr, r.stderr
