"""`glm5 bench` through its CLI: runs, resume and its refusals, exit codes, JUnit read back, shards, compare."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.sandbox import probe
from glm5cli.app import app
from tests.agent.bench.conftest import calc_repo, calc_row, calc_tasks, sh  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")
runner = CliRunner()


def bench(*args: str):
    return runner.invoke(app, ["bench", *map(str, args)], catch_exceptions=False)


def test_oracle_run_writes_the_record_and_a_junit_a_parser_reads(tmp_path, calc_tasks, monkeypatch):  # noqa: F811 (the imported fixtures)
    junitparser = pytest.importorskip("junitparser")
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = tmp_path / "run"
    r = bench("swe", calc_tasks, "--out", out, "--agent", "oracle", "-n", "2", "--junit", tmp_path / "j.xml", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["summary"]
    assert s["resolved"] == 2 and s["resolved_rate"] == 1.0 and s["infra_errors"] == 0
    for f in ("config.json", "results.jsonl", "report.json", "junit.xml", "summary.md"):
        assert (out / f).is_file(), f
    for tid in ("acme__calc-1", "acme__calc-2"):
        for f in ("trajectory.jsonl", "patch.diff", "test_output.txt", "report.json"):
            assert (out / "trials" / tid / "0" / f).is_file()
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "j.xml"))
    cases = [c for suite in xml for c in suite]
    assert sorted(c.name for c in cases) == ["acme__calc-1", "acme__calc-2"] and all(c.is_passed for c in cases)
    assert "glm5 bench swe: oracle" in summary.read_text()


def test_nop_run_completes_with_failures_named_and_min_resolved_fails_the_pipeline(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    junitparser = pytest.importorskip("junitparser")
    out = tmp_path / "nop"
    r = bench("swe", calc_tasks, "--out", out, "--agent", "nop")
    assert r.exit_code == 0, r.output  # the run completed, whatever the score
    xml = junitparser.JUnitXml.fromfile(str(out / "junit.xml"))
    case = next(c for suite in xml for c in suite)
    failure = case.result[0]
    assert isinstance(failure, junitparser.Failure) and "test_add.py::test_add" in failure.message
    r = bench("report", out, "--min-resolved", "0.5")
    assert r.exit_code == 1
    r = bench("report", out, "--markdown")
    assert r.exit_code == 0 and "| `acme__calc-1` | unresolved |" in r.stdout


def test_resume_keeps_finished_trials_and_refuses_a_changed_config(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    out = tmp_path / "run"
    assert bench("swe", calc_tasks, "--out", out, "--agent", "oracle").exit_code == 0
    lines = (out / "results.jsonl").read_text()
    r = bench("swe", calc_tasks, "--out", out, "--agent", "oracle", "-n", "3")  # concurrency: no effect on results
    assert r.exit_code == 0 and (out / "results.jsonl").read_text() == lines
    r = bench("swe", calc_tasks, "--out", out, "--agent", "nop")
    assert r.exit_code == 2 and "different agent" in r.output and "--force" in r.output
    r = bench("swe", calc_tasks, "--out", out, "--agent", "oracle", "-k", "2")
    assert r.exit_code == 2 and "different k" in r.output
    r = bench("swe", calc_tasks, "--out", out, "--agent", "oracle", "-k", "2", "--force")
    assert r.exit_code == 0
    keys = [(x["instance_id"], x["attempt"]) for x in map(json.loads, (out / "results.jsonl").read_text().splitlines())]
    assert sorted(keys) == sorted({*keys}) and len(keys) == 4  # attempt 1 of each task added, nothing doubled


def test_bad_input_exits_2_and_names_the_line(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(calc_tasks.read_text().splitlines()[0] + "\n{oops\n")
    r = bench("swe", bad, "--out", tmp_path / "r", "--agent", "oracle")
    assert r.exit_code == 2 and f"{bad}:2" in r.output.replace("\n", "")
    assert bench("swe", calc_tasks, "--out", tmp_path / "r", "--shard", "3/2").exit_code == 2
    assert bench("swe", calc_tasks, "--out", tmp_path / "r", "--agent", "gpt").exit_code == 2
    assert bench("swe", "--out", tmp_path / "r").exit_code == 2  # no tasks at all


def test_two_shards_merged_equal_one_run(tmp_path, calc_repo):  # noqa: F811 (the imported fixtures)
    tasks = tmp_path / "t.jsonl"
    rows = [calc_row(calc_repo, f"acme__calc-{i}") for i in range(3)]
    rows[1]["patch"] = ""  # one the oracle cannot solve, so the merge has both kinds
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for shard, out in (("1/2", "s1"), ("2/2", "s2"), ("1/1", "all")):
        assert bench("swe", tasks, "--out", tmp_path / out, "--agent", "oracle", "--shard", shard).exit_code == 0
    one = json.loads(bench("report", tmp_path / "all", "--json").stdout)
    merged = json.loads(bench("report", tmp_path / "s1", tmp_path / "s2", "--json").stdout)
    part = json.loads(bench("report", tmp_path / "s1", "--json").stdout)
    assert part["complete"] is False and part["summary"]["not_run"] == 1
    assert merged["complete"] is True and merged["shards"] == ["1/2", "2/2"]
    timing = ("seconds_total", "seconds_per_trial")
    assert {k: v for k, v in merged["summary"].items() if k not in timing} == {
        k: v for k, v in one["summary"].items() if k not in timing
    }
    assert {t: v["status"] for t, v in merged["tasks"].items()} == {t: v["status"] for t, v in one["tasks"].items()}
    assert one["tasks"]["acme__calc-1"]["status"] == "infra_error"  # no gold patch: the oracle cannot run


def test_compare_names_the_flips(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    assert bench("swe", calc_tasks, "--out", tmp_path / "a", "--agent", "nop").exit_code == 0
    assert bench("swe", calc_tasks, "--out", tmp_path / "b", "--agent", "oracle").exit_code == 0
    c = json.loads(bench("compare", tmp_path / "a", tmp_path / "b", "--json").stdout)["difference"]
    assert c["mean_difference"] == 1.0 and c["gained"] == ["acme__calc-1", "acme__calc-2"] and c["lost"] == []


def test_validate_finds_a_broken_task(tmp_path, calc_repo):  # noqa: F811 (the imported fixtures)
    tasks = tmp_path / "t.jsonl"
    good = calc_row(calc_repo, "good")
    broken = calc_row(calc_repo, "broken", FAIL_TO_PASS=json.dumps(["test_mul.py::test_mul"]), PASS_TO_PASS="[]")
    tasks.write_text(json.dumps(good) + "\n" + json.dumps(broken) + "\n")
    r = bench("validate", tasks, "--work", tmp_path / "w", "--json")
    assert r.exit_code == 1, r.output
    found = json.loads(r.stdout)["broken"]
    assert list(found) == ["broken"]
    assert any("FAIL_TO_PASS test test_mul.py::test_mul passes before the gold patch" in p for p in found["broken"])


def test_infra_errors_are_named_with_how_to_run_them_again(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    import socket

    with socket.socket() as s:  # a port nothing listens on: every model call is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    args = ("swe", calc_tasks, "--out", out, "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m",
            "--filter", "calc-1$", "--retries", "0")  # fmt: skip
    r = bench(*args)
    assert r.exit_code == 0 and "nothing is listening" in r.output and "--retry-infra-errors" in r.output, r.output
    n = len((out / "results.jsonl").read_text().splitlines())
    assert n == 1
    bench(*args)  # a plain resume keeps the trial as it is
    assert len((out / "results.jsonl").read_text().splitlines()) == n
    bench(*args, "--retry-infra-errors")  # runs it again (still refused here: one more try, recorded)
    tries = [json.loads(x)["try"] for x in (out / "results.jsonl").read_text().splitlines()]
    assert tries == [1, 2]


def test_a_relative_out_folder_works(tmp_path, calc_tasks, monkeypatch):  # noqa: F811 (the imported fixtures)
    # the help's own example is `--out runs/base`: the repository cache under it was read relative to the folder
    # git ran in, and every trial failed to clone
    monkeypatch.chdir(tmp_path)
    r = bench("swe", calc_tasks, "--out", "runs/rel", "--agent", "oracle", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"]["resolved"] == 2 and (tmp_path / "runs" / "rel" / "report.json").is_file()


def test_a_resolved_prediction_that_changed_test_configuration_is_named(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    # graded as the SWE-bench harness grades it (a conftest.py may be a real part of a fix), but a conftest.py hook
    # can also rewrite what the tests report: the result and summary.md name the file
    out = tmp_path / "run"
    cmd = "sed -i 's/a - b/a + b/' calc.py; printf 'import os\\n' > conftest.py"
    r = bench("swe", calc_tasks, "--out", out, "--agent", f"cmd:{cmd}", "--filter", "acme__calc-1", "--json")
    assert r.exit_code == 0, r.output
    (line,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert line["resolved"] is True and line["test_config_changed"] == ["conftest.py"]
    assert "`acme__calc-1` (conftest.py)" in (out / "summary.md").read_text()
    assert json.loads(r.stdout)["summary"]["resolved_with_test_config_changed"] == 1


def test_a_log_gets_one_line_per_trial_and_a_resumed_run_says_so(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    # off a terminal (CI logs, a file) rich's bar wrote nothing until the final table; a long line wrapped at 80
    out = tmp_path / ("a-long-folder-name-" * 4) / "run"
    r = bench("swe", calc_tasks, "--out", out, "--agent", "oracle")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("bench swe: ")]
    assert len(lines) == 2, r.stderr
    for n, line in enumerate(sorted(lines), 1):
        assert f" {n}/2 acme__calc-" in line and " resolved in " in line and "elapsed" in line, line
    assert "resuming" not in r.stderr
    r = bench("swe", calc_tasks, "--out", out, "--agent", "oracle")
    assert r.exit_code == 0 and "resuming: 2 of 2 trials already finished (2 resolved)" in r.stderr, r.stderr


def test_report_says_when_the_rate_is_below_min_resolved_and_refuses_a_percentage(tmp_path, calc_tasks):  # noqa: F811 (the imported fixtures)
    out = tmp_path / "nop"
    assert bench("swe", calc_tasks, "--out", out, "--agent", "nop").exit_code == 0
    r = bench("report", out, "--min-resolved", "0.5")
    assert r.exit_code == 1 and "resolved rate 0.000 is below --min-resolved 0.5" in " ".join(r.stderr.split())
    r = bench("report", out, "--min-resolved", "50")  # 50 meant 50%: every run would have failed the gate
    assert r.exit_code == 2 and "--min-resolved" in r.output and "less than or equal to 1" in r.output, r.output
    assert bench("report", out, "--min-resolved", "0").exit_code == 0


def test_validate_a_suite_checks_both_kinds_and_removes_its_temporary_trials(tmp_path, monkeypatch):
    # the report: `bench validate --suite builtin` asked for --kind, and left its glm5-validate-* folders behind
    import agent.bench.validate as validate

    seen, folders = [], []

    def check(tasks, work, **kw):
        seen.append(type(tasks[0]).__name__)
        folders.append(work)
        (work / "trial").mkdir(parents=True, exist_ok=True)
        return {getattr(t, "task_id", None) or t.instance_id: [] for t in tasks}

    monkeypatch.setattr(validate, "validate", check)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    r = bench("validate", "--suite", "builtin", "--json")
    assert r.exit_code == 0, r.output
    assert len(set(seen)) == 2 and json.loads(r.stdout)["work"] is None, (seen, r.stdout)
    assert not any(f.exists() for f in folders) and not list(tmp_path.glob("glm5-validate-*"))
