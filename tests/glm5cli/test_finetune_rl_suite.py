"""`glm5 finetune rl --env swe|terminal --suite builtin`: the bench's suites, as `glm5 bench --suite` reads them."""

from __future__ import annotations

from typer.testing import CliRunner

from agent.bench.tasks import load_swe_tasks
from glm5cli.app import app
from glm5cli.rl_cmd import _suite

runner = CliRunner(env={"COLUMNS": "300"})


def test_suite_builtin_gives_the_bench_suites_tasks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tasks_file, dirs = _suite("swe", "builtin", None, [])
    assert dirs == [] and len(load_swe_tasks(tasks_file)) >= 10
    assert _suite("swe", "builtin", None, [])[0] == tasks_file  # a rerun reuses it (its run folder resumes)
    tasks_file, dirs = _suite("terminal", "builtin", None, [])
    assert tasks_file is None and dirs and all((d / "task.toml").is_file() for d in dirs)


def test_suite_refusals_are_usage_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["finetune", "rl", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o")]
    for extra, said in (
        (["--env", "swe", "--suite", "nope"], "no swe suite named 'nope' (installed: "),
        (["--env", "completion", "--tasks", "t.jsonl", "--suite", "builtin"], "--suite is for --env swe / terminal"),
        (["--env", "swe", "--tasks", "t.jsonl", "--suite", "builtin"], "--suite or tasks"),
    ):
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code == 2 and said in r.output, (extra, r.output)
