"""benchmarks/gpu_check.py, the prepared H200 check, runs its whole code path on CPU (`--smoke`): so the script a
GPU run depends on is not first tried on the GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_runs_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (res,) = json.loads(out.read_text())["results"]
    assert res["logits"]["absorbed_vs_expanded"] < 1e-4  # fp32: the two MLA paths agree
    assert res["mtp"]["greedy_equal"]  # MTP drafts never change greedy output
    assert 0 < res["int4"]["logits_vs_bf16"] < 0.2
    assert res["decode"]["tokens_per_s"] > 0 and 0 < res["prefill"]["share_of_flop_bound"] < 1
