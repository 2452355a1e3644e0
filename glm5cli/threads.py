"""How many torch threads a glm5 process starts, and how they wait, chosen before torch loads.

torch starts one OpenMP thread per core, and by default OpenMP's threads spin-wait for each other at the end of
every parallel region. On a machine other jobs are using (a shared CI runner, a laptop compiling), a thread that
is not running holds up the others while they spin, burning the cores the other jobs need: an align-mtp step
took 110 s with two spinning threads under load, against 29 s on one thread and 22 s on two threads that sleep
when they wait (benchmarks/RESULTS.md, "Threads under load"). So a glm5 command keeps torch's thread count (the
cores it may run on, shared among torchrun's ranks on this machine) and, when the machine is busy as it starts
(the 1-minute load average at half the cores or more), sets OMP_WAIT_POLICY=PASSIVE: its threads then cost the
CPU they use, no more. On an idle machine OpenMP's default spin stays (waking a sleeping thread costs ~0.1 ms a
region; model/kernels/build.py runs its kernels on one thread under PASSIVE for that reason).

OMP_NUM_THREADS, OMP_WAIT_POLICY or GOMP_SPINCOUNT set by the user stand. The choice is made in
`glm5cli.app.main`, before any command imports torch, and written to the environment so the libraries that
read it at load (torch, libgomp) see it. A child glm5 process makes its own choice: GLM5_AUTO_THREADS marks
the values as glm5's, not the user's.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

MARK = "GLM5_AUTO_THREADS"
BUSY = 0.5  # the load average, per core, from which the machine counts as busy


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


def plan(cpus: int, load: float, processes: int = 1) -> tuple[int, bool]:
    """-> (threads for each of `processes` processes on `cpus` cores, whether they should sleep when they wait:
    yes when `load` runnable jobs already keep half the cores busy)."""
    return max(1, cpus // max(1, processes)), load >= BUSY * cpus


def choose(env: MutableMapping[str, str] | None = None, cpus: int | None = None,
           load: float | None = None) -> tuple[int, bool] | None:  # fmt: skip
    """Set OMP_NUM_THREADS and, on a busy machine, OMP_WAIT_POLICY=PASSIVE in `env` (os.environ), where the user
    set neither. -> (threads, passive) as chosen, or None where the user's settings stand."""
    env = os.environ if env is None else env
    mine = env.get(MARK, "")
    if mine:  # a parent glm5's choice, inherited: chosen again here, for this process's start
        threads, _, wait = mine.partition(",")
        if threads and env.get("OMP_NUM_THREADS") == threads:
            env.pop("OMP_NUM_THREADS")
        if wait == "passive" and env.get("OMP_WAIT_POLICY") == "PASSIVE":
            env.pop("OMP_WAIT_POLICY")
        env.pop(MARK)
    if "OMP_NUM_THREADS" in env and ("OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env):
        return None
    processes = int(env.get("LOCAL_WORLD_SIZE") or 1)  # torchrun: every rank on this machine shares the cores
    threads, passive = plan(_cpus() if cpus is None else cpus, _load() if load is None else load, processes)
    ours = "OMP_NUM_THREADS" not in env
    threads = int(env.setdefault("OMP_NUM_THREADS", str(threads)))
    passive = passive and "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    if ours or passive:  # only what glm5 set is marked, so a child never drops the user's own setting
        env[MARK] = f"{threads if ours else ''}," + ("passive" if passive else "")
    return threads, passive
