"""How many torch threads a glm5 process starts, chosen before torch loads.

torch starts one OpenMP thread per core, and OpenMP's threads spin-wait for each other at the end of every
parallel region. On a machine other jobs are using (a shared CI runner, a laptop compiling), a thread that is
not running holds up the others while they spin: two threads on two busy cores ran a training step 3.7-7.2x
slower than one thread did (benchmarks/RESULTS.md, "Threads under load"). So a glm5 command takes the cores that
are free when it starts (the cores it may run on, less the 1-minute load average, at least one), and OpenMP's
threads spin only briefly before they sleep, so a thread that waits gives its core back.

Set OMP_NUM_THREADS (or torchrun's processes' own) to choose yourself; `glm5` then changes nothing. The choice
is made in `glm5cli.app.main`, before any command imports torch, and written to the environment so the
libraries that read it at load (torch, libgomp) see it. A child glm5 process makes its own choice:
GLM5_AUTO_THREADS marks the value as glm5's, not the user's.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

MARK = "GLM5_AUTO_THREADS"
# libgomp's spins before a waiting thread sleeps (its default, 300,000, is ~0.1-0.3 s of a core that another
# job could use; 10,000 is tens of microseconds, enough to catch the next region of a busy step).
SPINS = "10000"


def free_cores(cpus: int, load: float, processes: int = 1) -> int:
    """Threads for each of `processes` processes started together on `cpus` cores with `load` runnable jobs
    already there: the free cores shared out, at least one each, never more than the cores."""
    free = cpus - load
    return max(1, min(cpus, int(free / max(1, processes) + 0.5)))


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows: no load average
        return 0.0


def choose(env: MutableMapping[str, str] | None = None, cpus: int | None = None,
           load: float | None = None) -> int | None:  # fmt: skip
    """Set OMP_NUM_THREADS (and libgomp's spin count) in `env` (os.environ) unless the user set them.
    -> the threads chosen, or None where the user's OMP_NUM_THREADS stands."""
    env = os.environ if env is None else env
    user = env.get("OMP_NUM_THREADS")
    if user is not None and env.get(MARK) != user:
        return None
    processes = int(env.get("LOCAL_WORLD_SIZE") or 1)  # torchrun: every rank on this machine shares the cores
    threads = free_cores(_cpus() if cpus is None else cpus, _load() if load is None else load, processes)
    env["OMP_NUM_THREADS"] = env[MARK] = str(threads)
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", SPINS)
    return threads
