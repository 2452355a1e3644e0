"""A run: the tasks (filtered, sharded) x k attempts, n at a time, into a run folder; resumable, retried.

    select(tasks, shard, filter)  -> this job's tasks (shard I/N takes every N-th task from the I-th, in file order:
                                     the same split in every job, and shards of equal size)
    run_bench(...)                -> claims the folder (config.json), skips what results.jsonl holds, runs the
                                     rest on a thread pool; each try's result is appended before the next starts;
                                     infra errors are retried up to `retries` more times in a new trial folder;
                                     a resume leaves a trial whose tries all ended so unless `retry_infra_errors`
                                     gives it `retries + 1` more (once the endpoint, say, is fixed)
Events go to `on_event(kind, data)` for the live progress: "start" {total, todo, done, resolved}, then "trial"
{result: TrialResult, final: False while an infra error will be retried}.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.bench.agents import AgentLimits, BenchAgent
from agent.bench.repos import RepoCache
from agent.bench.run_folder import RunFolder, final_results, tries
from agent.bench.tasks import SWETask, TerminalTask
from agent.bench.trial import TrialConfig, TrialResult, run_hidden, run_trial

Task = SWETask | TerminalTask


@dataclass
class RunOptions:
    k: int = 1
    concurrency: int = 1
    shard: tuple[int, int] = (1, 1)
    filter: str | None = None
    env: str = "local"
    retries: int = 1
    limits: AgentLimits = field(default_factory=AgentLimits)
    test_timeout_s: float = 1800.0
    flaky_reruns: int = 0
    keep_workdirs: bool = False
    repos_dir: Path | None = None
    base_dir: Path | None = None  # relative `repo` paths in the tasks file are relative to this
    force: bool = False
    source: str = ""  # what the tasks came from (a path, "--suite builtin"), for config.json
    # this invocation only (not in config.json): rerun trials whose every try ended in an infrastructure error
    retry_infra_errors: bool = False


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return int(m.group(1)), int(m.group(2))


def select(tasks: list[Task], shard: tuple[int, int] = (1, 1), pattern: str | None = None) -> list[Task]:
    if pattern:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"--filter {pattern!r} is not a regular expression: {e}") from None
        tasks = [t for t in tasks if rx.search(t.task_id)]
    i, n = shard
    return [t for j, t in enumerate(tasks) if j % n == i - 1]


def task_digest(task: Task) -> str:
    """What a task is, for telling whether a resumed run still runs the same tasks."""
    h = hashlib.sha256()
    if isinstance(task, SWETask):
        d = {k: v for k, v in asdict(task).items() if k not in ("source", "extra")}
        h.update(json.dumps(d, sort_keys=True, default=str).encode())
    else:
        for p in sorted(task.path.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(task.path)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def digest(tasks: list[Task]) -> str:
    return hashlib.sha256("\n".join(f"{t.task_id}:{task_digest(t)}" for t in tasks).encode()).hexdigest()[:16]


def run_config(kind: str, all_tasks: list[Task], tasks: list[Task], agent: BenchAgent, o: RunOptions) -> dict:
    suite = select(all_tasks, (1, 1), o.filter)  # what every shard of this run splits
    return {
        "schema": "glm5-bench-run/1",
        "kind": kind,
        "agent": agent.describe(),
        "k": o.k,
        "env": o.env,
        "limits": asdict(o.limits),
        "flaky_reruns": o.flaky_reruns,
        "test_timeout_s": o.test_timeout_s,
        "tasks_digest": digest(tasks),
        "suite_digest": digest(suite),
        "suite_ids": [t.task_id for t in suite],
        "task_ids": [t.task_id for t in tasks],
        "shard": f"{o.shard[0]}/{o.shard[1]}",
        "filter": o.filter,
        "source": o.source,
        "concurrency": o.concurrency,
        "retries": o.retries,
    }


def run_bench(kind: str, all_tasks: list[Task], agent: BenchAgent, out: Path, o: RunOptions,
              on_event: Callable[[str, Any], None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Run (or resume) into `out`; returns the final result of every (task, attempt) of this job."""
    emit = on_event or (lambda kind, data: None)
    tasks = select(all_tasks, o.shard, o.filter)
    folder = RunFolder(out)
    folder.open(run_config(kind, all_tasks, tasks, agent, o), force=o.force)
    try:
        lines = folder.lines()
        final, n_tries = final_results(lines), tries(lines)
        todo: list[tuple[Task, int, int]] = []  # (task, attempt, its last try)
        for t in tasks:
            for a in range(o.k):
                r, n = final.get((t.task_id, a)), n_tries.get((t.task_id, a), 0)
                if r is None or (r["status"] == "infra_error" and n <= o.retries):
                    todo.append((t, a, o.retries + 1))
                elif r["status"] == "infra_error" and o.retry_infra_errors:
                    todo.append((t, a, n + o.retries + 1))
        emit("start", {"total": len(tasks) * o.k, "todo": len(todo), "done": len(tasks) * o.k - len(todo),
                       "resolved": sum(1 for r in final.values() if r.get("resolved"))})  # fmt: skip
        config = TrialConfig(env=o.env, cache_dir=folder.path / "cache",
                             repos=RepoCache(folder.path / "cache", o.repos_dir, o.base_dir), limits=o.limits,
                             test_timeout_s=o.test_timeout_s, flaky_reruns=o.flaky_reruns,
                             keep_workdirs=o.keep_workdirs, hide=run_hidden([folder.path], all_tasks))  # fmt: skip

        def work(item: tuple[Task, int, int]) -> TrialResult:
            task, attempt, last = item
            first = n_tries.get((task.task_id, attempt), 0) + 1
            result = None
            for try_ in range(first, last + 1):
                result = run_trial(task, agent, folder.trial_dir(task.task_id, attempt, try_), config, attempt, try_)
                folder.append(result.as_dict())
                final = result.status != "infra_error" or try_ == last
                emit("trial", {"result": result, "final": final})
                if final:
                    break
            assert result is not None
            return result

        if o.concurrency <= 1:
            for item in todo:
                work(item)
        else:
            with ThreadPoolExecutor(max_workers=o.concurrency, thread_name_prefix="bench") as pool:
                list(pool.map(work, todo))
        ids = {t.task_id for t in tasks}
        return [r for key, r in sorted(final_results(folder.lines()).items()) if key[0] in ids and key[1] < o.k]
    finally:
        folder.close()
