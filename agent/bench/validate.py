"""`glm5 bench validate`: are the tasks sound? The oracle must solve every task and `nop` none; for SWE tasks
each FAIL_TO_PASS test must fail before the gold patch and pass after it, each PASS_TO_PASS test pass both times.

Runs an oracle and a nop trial per task (the same run_trial the bench uses) in a work folder, and returns the
problems found per task; a task with none is valid.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent.bench.agents import NopAgent, OracleAgent
from agent.bench.grades import MISSING
from agent.bench.job import load_tasks
from agent.bench.log_parsers import PASSED, SKIPPED, XFAIL
from agent.bench.repos import RepoCache
from agent.bench.tasks import SWETask, TaskError
from agent.bench.trial import TrialConfig, TrialResult, run_trial


def problems(task: Any, gold: TrialResult, nop: TrialResult) -> list[str]:
    out = []
    for who, r in (("oracle", gold), ("nop", nop)):
        if r.status == "infra_error":
            out.append(f"{who} run failed: {r.reason}")
    if gold.status == "unresolved":
        out.append(f"the oracle does not solve it ({gold.reason or f'reward {gold.reward:g}'})")
    if gold.flaky_tests:
        out.append(f"flaky under the gold patch: {', '.join(gold.flaky_tests)}")
    if nop.status == "resolved":
        out.append("nop solves it (the tests pass without any change)")
    if isinstance(task, SWETask) and nop.status != "infra_error":
        if not task.FAIL_TO_PASS:
            out.append("FAIL_TO_PASS is empty (nothing shows the fix)")
        for t in task.FAIL_TO_PASS:
            if nop.tests.get(t) in (PASSED, XFAIL):
                out.append(f"FAIL_TO_PASS test {t} passes before the gold patch")
        for t in task.PASS_TO_PASS:
            if nop.tests.get(t, MISSING) not in (PASSED, XFAIL, SKIPPED):
                out.append(f"PASS_TO_PASS test {t} does not pass before the patch ({nop.tests.get(t, MISSING)})")
    return out


def validate(tasks: list[Any], work: Path, env: str = "local", concurrency: int = 1, repos_dir: Path | None = None,
             base_dir: Path | None = None, on_done: Any = None) -> dict[str, list[str]]:  # fmt: skip
    work = Path(work)
    config = TrialConfig(env=env, cache_dir=work / "cache", repos=RepoCache(work / "cache", repos_dir, base_dir))
    nop_config = TrialConfig(env=env, cache_dir=work / "cache", repos=config.repos, flaky_reruns=0)

    def check(task: Any) -> tuple[str, list[str]]:
        gold = run_trial(task, OracleAgent(), work / "trials" / task.task_id / "oracle", config)
        nop = run_trial(task, NopAgent(), work / "trials" / task.task_id / "nop", nop_config)
        found = problems(task, gold, nop)
        if on_done:
            on_done(task.task_id, found)
        return task.task_id, found

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return dict(pool.map(check, tasks))


def validate_kinds(kinds: list[str], paths: list[Path], suite: str | None, work: Path, *, env: str = "local",
                   concurrency: int = 1, repos_dir: Path | None = None,
                   on_done: Any = None) -> dict[str, list[str]]:  # fmt: skip
    """`glm5 bench validate`: the tasks of each kind checked under work/<kind>; a named suite asked for several
    kinds that has no task of one of them is skipped for that kind. A bad task file raises TaskError."""
    found: dict[str, list[str]] = {}
    for kind in kinds:
        try:
            tasks, _, base_dir = load_tasks(kind, paths, suite, work / kind / "suite")
        except TaskError as e:
            if len(kinds) > 1 and "no " in str(e) and "suite named" in str(e):
                continue  # the suite has no tasks of this kind
            raise
        found |= validate(tasks, work / kind, env=env, concurrency=concurrency, repos_dir=repos_dir,
                          base_dir=base_dir, on_done=on_done)  # fmt: skip
    return found
