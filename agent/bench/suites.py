"""Named suites from plugins: `--suite NAME` asks `register_benchmarks` for "<kind>:NAME" and materializes it.

A suite object has `kind` ("swe" | "terminal"), `name`, `description` and `materialize(dest) -> list[Path]`: a
SWE-bench JSONL for "swe" (its `repo` fields local repositories under dest), task folders for "terminal".
Materializing is deterministic and idempotent, so a resumed run gets the same tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent import plugin_registry
from agent.bench.tasks import TaskError, load_swe_tasks, load_terminal_tasks


def available(kind: str | None = None) -> dict[str, Any]:
    out = {}
    for key, suite in plugin_registry.default_manager().benchmarks().items():
        if hasattr(suite, "materialize") and (kind is None or key.startswith(f"{kind}:")):
            out[key] = suite
    return out


def suite_tasks(kind: str, name: str, dest: Path) -> list[Any]:
    """The tasks of suite "<kind>:<name>", materialized under dest."""
    suites = available(kind)
    key = f"{kind}:{name}"
    if key not in suites:
        known = ", ".join(k.split(":", 1)[1] for k in sorted(suites)) or "none"
        raise TaskError(f"no {kind} suite named {name!r} (installed: {known})")
    paths = [Path(p) for p in suites[key].materialize(Path(dest))]
    if kind == "swe":
        tasks = []
        for p in paths:
            tasks += load_swe_tasks(p)
        return tasks
    return load_terminal_tasks(paths)
