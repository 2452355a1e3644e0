"""The built-in multilingual suite: its rows load as SWE-bench rows naming the harness's parser for their language,
with the toolchains' Dockerfile; their patches are real diffs of their repositories. (Running them needs their
toolchains: tests/agent/bench/test_docker_mode.py runs them in containers.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.bench.tasks import load_swe_tasks
from plugins.bench_suites.multilingual_suite import MultilingualSuite


def test_rows_load_and_their_patches_apply(tmp_path):
    harness = pytest.importorskip("swebench.harness.log_parsers")  # the rows name the harness's parsers
    [jsonl] = MultilingualSuite().materialize(tmp_path / "suite")
    tasks = load_swe_tasks(jsonl)
    assert sorted(t.extra["language"] for t in tasks) == ["c", "go", "java", "javascript", "php", "ruby", "rust"]
    for t in tasks:
        assert t.log_parser in harness.PARSER_REGISTRY and t.FAIL_TO_PASS
        assert "FROM glm5-bench-base:bookworm" in t.extra["dockerfile"]
        work = tmp_path / t.instance_id
        subprocess.run(["git", "clone", "-q", t.repo, str(work)], check=True)
        subprocess.run(["git", "-C", str(work), "checkout", "-q", t.base_commit], check=True)
        for patch in (t.patch, t.test_patch):
            r = subprocess.run(["git", "-C", str(work), "apply", "-"], input=patch, text=True, capture_output=True)
            assert r.returncode == 0, (t.instance_id, r.stderr)


MAVEN_REPO = Path("/usr/share/maven-repo")  # Debian's: the plugins and JUnit 4 the Java task's Maven reads offline


@pytest.mark.skipif(not (shutil.which("mvn") and shutil.which("javac") and (MAVEN_REPO / "junit").is_dir()),
                    reason="needs Maven, a JDK and Debian's Maven repository (apt install maven default-jdk-headless "
                           "junit4 libsurefire-java); tests/agent/bench/test_docker_mode.py runs it in a container")  # fmt: skip
def test_the_java_task_runs_maven_offline_and_is_graded_by_the_harnesss_maven_parser(tmp_path):
    """The Java task where the machine has its toolchain (local mode): the gold patch resolves, no patch does not,
    and every per-test status equals what the harness's parse_log_maven reads from the same log."""
    harness = pytest.importorskip("swebench.harness.log_parsers")
    for agent, resolved in (("oracle", True), ("nop", False)):
        out = tmp_path / agent
        r = subprocess.run([sys.executable, "-m", "glm5cli.app", "bench", "swe", "--suite", "multilingual", "--filter",
                            "statsx", "--env", "local", "--agent", agent, "--out", str(out)],
                           capture_output=True, text=True, timeout=900)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        [row] = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        assert row["resolved"] is resolved, row["reason"]
        [log] = (out / "trials").glob("*/0/test_output.txt")
        # the grading run's output: from its first traced line to its exit code (the log shows the command first,
        # then the run without the prediction)
        first = log.read_text().split("\n+ rc=0\n")[1].split("[exit code")[0]
        assert harness.parse_log_maven(first, None) == row["tests"]
        assert row["tests"]["ex.StatsTest#meanOfUnevenValues"] == ("PASSED" if resolved else "FAILED")
