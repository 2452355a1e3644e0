"""What a `glm5 bench` command does between parsing and showing: tasks from files or a suite, the run, the reports.

The Typer commands (glm5cli/bench_cmd.py) only parse flags and show progress and results; this module does the
work so scripts and tests can call it without a CLI.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.bench.agents import BenchAgent
from agent.bench.reports import build_report, write_reports
from agent.bench.runner import RunOptions, run_bench
from agent.bench.suites import suite_tasks
from agent.bench.tasks import TaskError, load_swe_tasks, load_terminal_tasks


def load_tasks(kind: str, paths: list[Path], suite: str | None, suite_dir: Path) -> tuple[list[Any], str, Path | None]:
    """(tasks, source description, the folder relative repo paths are read from)."""
    if suite and paths:
        raise TaskError("give task files or --suite, not both")
    if suite:
        return suite_tasks(kind, suite, suite_dir), f"--suite {suite}", None
    if not paths:
        raise TaskError(f"no tasks: give {'a tasks file' if kind == 'swe' else 'task folders'} or --suite builtin")
    if kind == "swe":
        tasks: list[Any] = []
        for p in paths:
            tasks += load_swe_tasks(p)
        ids = [t.instance_id for t in tasks]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise TaskError(f"instance ids repeat across the task files: {', '.join(dup[:5])}")
        return tasks, " ".join(map(str, paths)), Path(paths[0]).resolve().parent
    return load_terminal_tasks(paths), " ".join(map(str, paths)), None


def run_job(kind: str, tasks: list[Any], agent: BenchAgent, out: Path, options: RunOptions,
            junit: Path | None = None, on_event: Callable[[str, Any], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run (or resume) and write report.json, junit.xml and summary.md in `out` (and `junit`); the report."""
    run_bench(kind, tasks, agent, out, options, on_event)
    report = build_report([out])
    write_reports(out, report, junit)
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file:
        with open(summary_file, "a", encoding="utf-8") as f:
            f.write((Path(out) / "summary.md").read_text(encoding="utf-8") + "\n")
    return report


def below(report: dict[str, Any], min_resolved: float | None) -> bool:
    """True when --min-resolved is set and the resolved rate is under it (or there is no graded trial)."""
    if min_resolved is None:
        return False
    rate = report["summary"]["resolved_rate"]
    return rate is None or rate < min_resolved
