"""The runner: infra errors retried into a new trial folder and kept out of the score; shards are a partition."""

from __future__ import annotations

import json

import pytest

from agent.bench.agents import NopAgent
from agent.bench.environments import InfraError
from agent.bench.reports import build_report
from agent.bench.runner import RunOptions, parse_shard, run_bench, select
from agent.bench.tasks import load_swe_tasks
from agent.sandbox import probe


class FlakyInfraAgent(NopAgent):
    """nop, except that its first run of each task finds the environment broken."""

    def __init__(self):
        self.seen: set[str] = set()

    def run(self, task, env, trial_dir, limits, *, attempt=0):
        if task.task_id not in self.seen:
            self.seen.add(task.task_id)
            raise InfraError("the sandbox died")
        return super().run(task, env, trial_dir, limits)


@pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")
def test_infra_error_is_retried_and_kept_out_of_the_score(tmp_path, calc_tasks):
    tasks = load_swe_tasks(calc_tasks)[:1]
    out = tmp_path / "run"
    results = run_bench("swe", tasks, FlakyInfraAgent(), out, RunOptions(retries=1, flaky_reruns=0))
    assert [r["status"] for r in results] == ["unresolved"]
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [(x["status"], x["try"]) for x in lines] == [("infra_error", 1), ("unresolved", 2)]
    assert (out / "trials" / "acme__calc-1" / "0").is_dir() and (out / "trials" / "acme__calc-1" / "0.try2").is_dir()
    s = build_report([out])["summary"]
    assert s["infra_errors"] == 0 and s["infra_errors_retried"] == 1 and s["graded"] == 1
    # with no retries left the infra error stays, labelled, out of the score
    out2 = tmp_path / "run2"
    results = run_bench("swe", tasks, FlakyInfraAgent(), out2, RunOptions(retries=0))
    assert results[0]["status"] == "infra_error" and results[0]["resolved"] is None
    rep = build_report([out2])
    assert rep["summary"]["resolved_rate"] is None and rep["tasks"]["acme__calc-1"]["status"] == "infra_error"
    # a plain resume keeps it; --retry-infra-errors (the cause fixed) runs it again, in a new trial folder
    fixed = FlakyInfraAgent()
    fixed.seen.add("acme__calc-1")
    assert run_bench("swe", tasks, fixed, out2, RunOptions(retries=0))[0]["status"] == "infra_error"
    results = run_bench("swe", tasks, fixed, out2, RunOptions(retries=0, retry_infra_errors=True))
    assert results[0]["status"] == "unresolved" and (out2 / "trials" / "acme__calc-1" / "0.try2").is_dir()
    lines = [json.loads(x) for x in (out2 / "results.jsonl").read_text().splitlines()]
    assert [(x["status"], x["try"]) for x in lines] == [("infra_error", 1), ("unresolved", 2)]
    assert build_report([out2])["summary"]["graded"] == 1
    # nothing left to retry: a further resume runs nothing
    assert run_bench("swe", tasks, FlakyInfraAgent(), out2, RunOptions(retries=0, retry_infra_errors=True)) == results


def test_shards_partition_the_tasks_deterministically(calc_tasks):
    tasks = load_swe_tasks(calc_tasks) * 3  # ids repeat here; only the split matters
    parts = [select(tasks, (i, 3)) for i in (1, 2, 3)]
    assert sum(len(p) for p in parts) == len(tasks) and all(len(p) == 2 for p in parts)
    assert select(tasks, (2, 3)) == parts[1]
    assert [t.task_id for t in select(tasks, (1, 1), "calc-2$")] == ["acme__calc-2"] * 3
    with pytest.raises(ValueError, match="expected I/N"):
        parse_shard("0/3")
    with pytest.raises(ValueError, match="not a regular expression"):
        select(tasks, (1, 1), "(")
