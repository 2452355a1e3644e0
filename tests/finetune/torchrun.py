"""Two CPU ranks under a real torchrun (gloo), for the tests that check sharded training against one process.

On the machines CI runs on, a rank sometimes aborts as gloo starts or ends, with "terminate called
without an active exception" (SIGABRT) and nothing of ours on the stack: about one whole-suite run in three, never
when the test runs alone, not reproduced in 20 runs in a row under load or beside a Docker daemon. Such a run is
started again, up to ATTEMPTS times; any other failure, or the same one every time, fails the test with the
run's stderr.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).parents[2]
GLOO_ABORT = "terminate called without an active exception"
ATTEMPTS = 3


def torchrun(nproc: int, *args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node NPROC --standalone ARGS` (--standalone: the rendezvous store binds a free port
    itself, so no other process can take it between our choosing it and torchrun binding it)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--standalone", *args]
    for _ in range(ATTEMPTS):
        r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if r.returncode == 0 or GLOO_ABORT not in r.stderr:
            break
        # the evidence, in pytest's warnings summary (CI's log), for finding the cause
        warnings.warn(f"torchrun started again after gloo's abort; its stderr ended: {r.stderr[-1500:]}", stacklevel=2)
    assert r.returncode == 0, r.stderr[-4000:]
    return r
