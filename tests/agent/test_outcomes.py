"""Outcome labels: a test run is labelled from the runner's summary line, or from an exit status that is the
runner's own; anything else is unknown, never passed."""

from __future__ import annotations

import sys

import pytest

from agent.outcomes import FAILED, PASSED, UNKNOWN, exit_status_is_the_runners, label_test_run, summary
from agent.tools.base import ToolResult
from agent.trajectory import Trajectory
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


def result(output: str, rc: int | None) -> ToolResult:
    return ToolResult(output, is_error=rc != 0, data={"returncode": rc})


@pytest.mark.parametrize(
    ("output", "status"),
    [
        ("F.\n=== 1 failed, 2 passed in 0.12s ===", FAILED),
        ("...\n3 passed, 1 warning in 1.00s", PASSED),
        ("E\n1 error in 0.1s", FAILED),
        ("Ran 3 tests in 0.001s\n\nOK", PASSED),
        ("Ran 3 tests in 0.001s\n\nFAILED (failures=1)", FAILED),
        ("test result: ok. 3 passed; 0 failed", PASSED),
        ("test result: FAILED. 2 passed; 1 failed", FAILED),
        ("--- FAIL: TestAdd (0.00s)\nFAIL\tpkg\t0.1s", FAILED),
        ("Tests:       1 failed, 4 passed, 5 total", FAILED),
        ("3 passed in 0.1s\n... later package ...\n1 failed in 0.2s", FAILED),
    ],
)
def test_summary_lines(output, status):
    assert summary(output)[0] == status


def test_no_summary_is_none():
    assert summary("collected 0 items\n") is None and summary("") is None


@pytest.mark.parametrize(
    ("command", "trusted"),
    [
        ("python -m pytest -q", True),
        ("cd pkg && pytest -x", True),
        ("pytest && echo all good", True),
        ("python -m pytest -q 2>&1", True),
        ("pytest &", False),
        ("python -m pytest -q 2>&1 | tail -5", False),
        ("set -o pipefail; pytest | tail -5", True),
        ("pytest || true", False),
        ("pytest; echo done", False),
        ("pytest\nls", False),
        ("ls", False),
    ],
)
def test_whose_exit_status(command, trusted):
    assert exit_status_is_the_runners(command) is trusted


def test_labels():
    # the case from the issue: "1 failed" through `| tail -5`, exit status 0 (tail's)
    lab = label_test_run("python -m pytest -q 2>&1 | tail -5", result("F\n1 failed in 0.05s\n[exit code 0]", 0))
    assert lab["status"] == FAILED and lab["passed"] is False
    # a pipeline without a summary line cannot be told: unknown, not passed
    lab = label_test_run("pytest -q 2>&1 | grep -c xyz", result("0\n[exit code 0]", 0))
    assert lab["status"] == UNKNOWN and lab["passed"] is None
    # a plain run without a summary: the runner's own exit status decides
    assert label_test_run("make test", result("boom\n[exit code 2]", 2))["status"] == FAILED
    assert label_test_run("make test", result("fine\n[exit code 0]", 0))["status"] == PASSED
    # a summary of passes but the runner's own failing status (coverage floor): failed
    assert label_test_run("pytest --cov", result("5 passed in 1s\nFAIL Required test coverage", 1))["passed"] is False
    # a background run has no status yet
    assert label_test_run("pytest", result("started background job", None))["status"] == UNKNOWN
    assert label_test_run("ls -la", result("x", 0)) is None


def test_pipeline_through_the_agent_is_not_labelled_passed(repo, fake_model):
    """End to end: the repo's test fails (calc.add subtracts); the agent runs it through `| tail -5`."""
    cmd = f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py 2>&1 | tail -5"
    fake_model.script = [reply(tools=[("bash", {"command": cmd})]), reply("ran the tests")]
    s = make_session(repo, fake_model, flags={"mode": "auto"})
    res = s.agent.run("run the tests")
    s.agent.finish(res.exit_status, res.final)
    s.close()
    out = Trajectory.load(s.path).outcome()
    assert out["tests"][0]["returncode"] == 0  # tail's status
    assert out["tests"][0]["status"] == FAILED and out["tests_passed"] is False, out
