"""Fixtures: a small real git repository with a bug, and SWE-bench rows over it (gold patch, test patch)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import fake_model, isolated_config  # noqa: F401 (fixtures)

CALC_BUG = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
CALC_FIX = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST_MUL = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
TEST_ADD = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def sh(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def diff_between(repo: Path, edits: dict[str, str]) -> str:
    """A unified diff of `edits` against HEAD, made by git (then the tree is restored)."""
    for name, text in edits.items():
        (repo / name).write_text(text)
    sh(repo, "add", "-A")
    d = sh(repo, "diff", "--cached", "HEAD")
    sh(repo, "reset", "-q", "--hard", "HEAD")
    return d


@pytest.fixture
def calc_repo(tmp_path) -> Path:
    r = tmp_path / "src" / "calc"
    r.mkdir(parents=True)
    sh(r, "init", "-q", "-b", "main")
    sh(r, "config", "user.email", "t@example.com")
    sh(r, "config", "user.name", "Test")
    (r / "calc.py").write_text(CALC_BUG)
    (r / "test_mul.py").write_text(TEST_MUL)
    sh(r, "add", "-A")
    sh(r, "commit", "-q", "-m", "init")
    return r


def calc_row(repo: Path, instance_id: str = "acme__calc-1", **over) -> dict:
    base = sh(repo, "rev-parse", "HEAD").strip()
    row = {
        "instance_id": instance_id,
        "repo": str(repo),
        "base_commit": base,
        "problem_statement": "add(2, 3) returns -1; it should add.",
        "patch": diff_between(repo, {"calc.py": CALC_FIX}),
        "test_patch": diff_between(repo, {"test_add.py": TEST_ADD}),
        "FAIL_TO_PASS": json.dumps(["test_add.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["test_mul.py::test_mul"]),
        "version": "1.0",
        "environment_setup_commit": base,
        # this checkout's venv has many pytest plugins (hypothesis, asyncio, ...): 3 s of imports per run
        "test_cmd": "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider test_add.py test_mul.py",
    }
    row.update(over)
    return row


@pytest.fixture
def calc_tasks(tmp_path, calc_repo) -> Path:
    p = tmp_path / "tasks.jsonl"
    rows = [calc_row(calc_repo, "acme__calc-1"), calc_row(calc_repo, "acme__calc-2")]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp (the sandbox's /tmp is its own, so nothing under pytest's tmp_path is ever visible
    inside): where an isolation test puts what a trial must not see, as a user's run folders are."""
    import shutil
    import tempfile

    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path.home()
    d = Path(tempfile.mkdtemp(prefix="glm5-test-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)
