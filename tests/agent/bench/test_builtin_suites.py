"""The built-in suites (plugins/bench_suites) through `--suite builtin`: the oracle solves every task, nop none."""

from __future__ import annotations

import pytest

from agent.bench.suites import available, suite_tasks
from agent.bench.tasks import TaskError
from agent.bench.validate import validate
from agent.sandbox import probe

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")


def test_suites_come_from_register_benchmarks(tmp_path):
    assert {"swe:builtin", "terminal:builtin"} <= set(available())
    with pytest.raises(TaskError, match="no swe suite named 'nope' \\(installed: builtin"):
        suite_tasks("swe", "nope", tmp_path)


def test_terminal_builtin_oracle_solves_all_nop_none(tmp_path):
    tasks = suite_tasks("terminal", "builtin", tmp_path / "suite")
    assert len(tasks) >= 6
    assert validate(tasks, tmp_path / "w", concurrency=2) == {t.task_id: [] for t in tasks}


def test_swe_builtin_sample_oracle_solves_nop_does_not(tmp_path):
    tasks = suite_tasks("swe", "builtin", tmp_path / "suite")
    assert len(tasks) >= 12
    sample = tasks[::4]  # one per generated repository and kind of bug, to stay quick; the full set is below
    assert validate(sample, tmp_path / "w", concurrency=2) == {t.task_id: [] for t in sample}


@pytest.mark.slow
def test_swe_builtin_all_valid(tmp_path):
    tasks = suite_tasks("swe", "builtin", tmp_path / "suite")
    assert validate(tasks, tmp_path / "w", concurrency=4) == {t.task_id: [] for t in tasks}
