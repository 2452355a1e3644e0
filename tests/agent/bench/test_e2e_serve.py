"""`glm5 bench swe --agent glm5` against a real `glm5 serve` over the tiny random checkpoint.

This proves the bench's glm5 agent speaks to our server and records what it returned (the wire and the record,
not skill: a random model fixes nothing, so the trial is graded and comes out unresolved, never an infra error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.sandbox import probe
from agent.trajectory import Trajectory
from tests.agent.bench.conftest import calc_row
from tests.agent.test_e2e_serve import served_tiny  # noqa: F401 (a fixture)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401 (a fixture)

ROOT = str(Path(__file__).resolve().parents[3])


@pytest.mark.slow
@pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")
def test_bench_glm5_agent_against_glm5_serve(served_tiny, calc_repo, tmp_path):  # noqa: F811 (the fixture)
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(calc_row(calc_repo)) + "\n")
    out = tmp_path / "run"
    env = {**os.environ, "E2E_KEY": "e2e-key", "PYTHONPATH": ROOT}
    r = subprocess.run(
        [sys.executable, "-m", "glm5cli", "bench", "swe", str(tasks), "--out", str(out), "--agent", "glm5",
         "--base-url", served_tiny, "--model", "glm5-tiny", "--api-key-env", "E2E_KEY", "--max-turns", "2", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert line["status"] == "unresolved" and line["resolved"] is False, line  # graded, not an infra error
    assert line["prompt_tokens"] > 0 and line["steps"] >= 1
    traj = Trajectory.load(out / "trials" / "acme__calc-1" / "0" / "trajectory.jsonl")
    calls = [x for x in traj.records if x.get("type") == "model_call"]
    assert calls and calls[0]["usage"]["completion_tokens"] > 0
    labels = traj.outcome()
    assert labels["resolved"] is False and labels["reward"] == 0.0 and "test_add.py::test_add" in labels["tests_status"]
    assert "e2e-key" not in (out / "trials" / "acme__calc-1" / "0" / "trajectory.jsonl").read_text()
