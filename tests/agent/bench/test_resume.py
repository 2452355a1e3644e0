"""kill -9 in the middle of a run, then the same command again: no trial lost, none doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.sandbox import probe
from tests.agent.bench.conftest import calc_row

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")
ROOT = str(Path(__file__).resolve().parents[3])


def test_kill_minus_9_then_resume(tmp_path, calc_repo):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps(calc_row(calc_repo, f"acme__calc-{i}")) + "\n" for i in range(4)))
    out = tmp_path / "run"
    # a slow external agent that fixes the bug, so a kill lands while a trial is in flight
    cmd = [sys.executable, "-m", "glm5cli", "bench", "swe", str(tasks), "--out", str(out), "-n", "1",
           "--agent", "cmd:sleep 1.5; sed -i 's/a - b/a + b/' calc.py", "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not results.exists() or len(results.read_text().splitlines()) < 2):
        time.sleep(0.1)
    time.sleep(0.7)  # into the third trial's agent phase
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = [json.loads(x) for x in results.read_text().splitlines()]
    assert 2 <= len(done_before) < 4, "the kill should land mid-run"
    in_flight = [d for d in (out / "trials").iterdir() if not (d / "0" / "report.json").exists()]
    assert in_flight  # a trial folder without its report: it was running

    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    keys = [(x["instance_id"], x["attempt"]) for x in lines]
    assert sorted(keys) == [(f"acme__calc-{i}", 0) for i in range(4)]  # each once: none lost, none doubled
    assert lines[: len(done_before)] == done_before  # the finished ones were kept, not rerun
    assert json.loads(r.stdout)["summary"]["resolved"] == 4
