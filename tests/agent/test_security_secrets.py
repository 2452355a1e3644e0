"""Fence 5 (issue 15) and issue 18: secrets reach neither disk nor children."""

from __future__ import annotations

import json

from agent.child_env import scrubbed_env
from agent.environment import Environment
from agent.redact import REDACTED, Redactor
from agent.settings import load_settings
from agent.trajectory import TrajectoryWriter

AWS = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SK = "sk-proj-abcdefghijklmnopqrstuvwxyz0123"


def test_assignments_with_secret_names_are_redacted():
    r = Redactor(environ={})
    env_file = f"DB_PASSWORD=hunter2hunter2\nexport AWS_SECRET_ACCESS_KEY={AWS}\nDEBUG=1\nMAX_TOKENS=4096\n"
    out = r.text(env_file)
    assert "hunter2hunter2" not in out and AWS not in out
    assert "DB_PASSWORD=" in out and "DEBUG=1" in out and "MAX_TOKENS=4096" in out
    creds = f"[default]\naws_access_key_id = AKIAABCDEFGHIJKLMNOP\naws_secret_access_key = {AWS}\n"
    assert AWS not in r.text(creds) and "AKIA" not in r.text(creds)
    assert "s3cr3tvalue" not in r.text('{"api_key": "s3cr3tvalue", "model": "glm-5"}')
    # code is not a secret
    for code in ("token = self.next()", "max_tokens = 100", "key = sorted(items)", "password = os.environ['PW']"):
        assert r.text(code) == code


def test_the_password_in_a_urls_credentials_is_redacted():
    # `git remote -v` or .git/config with a token in the remote's URL, a database URL in a settings file
    r = Redactor(environ={})
    for url, secret in (
        ("https://x-access-token:abcd1234efgh5678@github.com/o/r.git", "abcd1234efgh5678"),
        ("DATABASE_URL=postgres://app:s3cretpw99@db:5432/x", "s3cretpw99"),
        ("url = 'https://bob:hunter2hunter2@example.com/v1'", "hunter2hunter2"),
    ):
        out = r.text(url)
        assert secret not in out and REDACTED in out and "@" in out, out
    for plain in ("https://github.com/o/r.git", "see http://localhost:8000/v1 and a@b.c", "ssh://git@host:22/r"):
        assert r.text(plain) == plain


def test_a_value_equal_to_a_secret_variable_is_redacted():
    r = Redactor(environ={"DB_PASSWORD": "hunter2hunter2", "HOME": "/root"})
    assert r.text("connecting with hunter2hunter2 as root") == f"connecting with {REDACTED} as root"


def test_a_key_split_across_logprob_tokens_is_redacted(tmp_path):
    tokens = [
        {"token": "use ", "logprob": -0.1, "bytes": [117], "top_logprobs": []},
        {"token": "sk-", "logprob": -0.2, "bytes": [115, 107, 45], "top_logprobs": [{"token": "sk-", "logprob": -0.2}]},
        {"token": SK[3:], "logprob": -0.3, "bytes": list(SK[3:].encode()), "top_logprobs": []},
        {"token": " now", "logprob": -0.4, "bytes": [32], "top_logprobs": []},
    ]
    response = {
        "choices": [
            {
                "message": {"role": "assistant", "content": f"use {SK} now"},
                "logprobs": {"content": tokens},
                "token_ids": [1, 2, 3, 4],
            }
        ],
        "prompt_token_ids": [9, 9],
    }
    w = TrajectoryWriter(tmp_path / "t.jsonl")
    w.write("model_call", response=response, n_messages=1)
    w.close()
    raw = (tmp_path / "t.jsonl").read_text()
    assert "sk-" not in raw and SK[3:] not in raw and "abcdefghijklmnop" not in raw
    rec = [json.loads(line) for line in raw.splitlines()][-1]
    choice = rec["response"]["choices"][0]
    assert [t["token"] for t in choice["logprobs"]["content"]] == ["use ", REDACTED, REDACTED, " now"]
    assert choice["token_ids"] is None and "token_ids_dropped" in choice  # ids would decode to the key
    assert rec["response"]["prompt_token_ids"] is None


def test_long_output_saved_to_disk_is_redacted(repo, tmp_path):
    env = Environment(repo, scratch_dir=tmp_path / "scratch", inline_chars=100)
    res = env.execute(f"printf 'DB_PASSWORD=hunter2hunter2\\n{SK}\\n'; seq 1 200")
    assert res.full_output_path
    saved = open(res.full_output_path).read()
    assert "hunter2hunter2" not in saved and SK not in saved and "200" in saved


def test_commands_get_a_scrubbed_environment(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_API_KEY", "glm5-key-0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS)
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_" + "a" * 36)
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:pa55word@pypi.example/simple")
    env = Environment(repo, scratch_dir=tmp_path / "scratch")
    out = env.execute("env").output
    for leaked in ("glm5-key", AWS, "ghp_", "pa55word"):
        assert leaked not in out
    assert "PATH=" in out and "HOME=" in out


def test_settings_add_to_the_environment(repo, isolated_config, monkeypatch, tmp_path):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "needed-by-tests-123")
    (isolated_config / "config.toml").write_text(
        '[sandbox]\nenv = { FEATURE_FLAG = "on" }\npass_env = ["MY_SERVICE_TOKEN"]\n'
    )
    s = load_settings(repo)
    env = scrubbed_env(s.env, s.pass_env)
    assert env["FEATURE_FLAG"] == "on" and env["MY_SERVICE_TOKEN"] == "needed-by-tests-123"


def test_mcp_servers_get_a_scrubbed_environment(monkeypatch):
    import types

    from agent.mcp import MCPConnection

    monkeypatch.setenv("GLM5_API_KEY", "glm5-key-0123456789")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_" + "b" * 36)
    spec = {"command": "server", "env": {"ROOT": "."}, "pass_env": ["GITHUB_TOKEN"]}
    target = MCPConnection._target(types.SimpleNamespace(spec=spec, name="s", cwd=None))
    assert "GLM5_API_KEY" not in target.env and target.env["GITHUB_TOKEN"].startswith("ghp_")
    assert target.env["ROOT"] == "." and "PATH" in target.env


def test_a_background_jobs_log_on_disk_is_redacted(repo, tmp_path):
    env = Environment(repo, scratch_dir=tmp_path / "scratch")
    job = env.start_background(f"echo start; echo 'key {SK}'; echo AWS_SECRET_ACCESS_KEY={AWS}; echo end")
    job.wait(timeout=30)
    log = job.log_path.read_text()
    assert SK not in log and AWS not in log
    assert log.startswith("start\n") and log.rstrip().endswith("end") and REDACTED in log
