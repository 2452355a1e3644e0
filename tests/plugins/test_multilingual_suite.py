"""The built-in multilingual suite: its rows load as SWE-bench rows naming the harness's parser for their language,
with the toolchains' Dockerfile; their patches are real diffs of their repositories. (Running them needs their
toolchains: tests/agent/bench/test_docker_mode.py runs them in containers.)"""

from __future__ import annotations

import subprocess

import pytest

from agent.bench.tasks import load_swe_tasks
from plugins.bench_suites.multilingual_suite import MultilingualSuite


def test_rows_load_and_their_patches_apply(tmp_path):
    harness = pytest.importorskip("swebench.harness.log_parsers")  # the rows name the harness's parsers
    [jsonl] = MultilingualSuite().materialize(tmp_path / "suite")
    tasks = load_swe_tasks(jsonl)
    assert sorted(t.extra["language"] for t in tasks) == ["c", "go", "javascript", "php", "ruby", "rust"]
    for t in tasks:
        assert t.log_parser in harness.PARSER_REGISTRY and t.FAIL_TO_PASS
        assert "FROM glm5-bench-base:bookworm" in t.extra["dockerfile"]
        work = tmp_path / t.instance_id
        subprocess.run(["git", "clone", "-q", t.repo, str(work)], check=True)
        subprocess.run(["git", "-C", str(work), "checkout", "-q", t.base_commit], check=True)
        for patch in (t.patch, t.test_patch):
            r = subprocess.run(["git", "-C", str(work), "apply", "-"], input=patch, text=True, capture_output=True)
            assert r.returncode == 0, (t.instance_id, r.stderr)
