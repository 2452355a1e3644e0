"""Host-program lookup time against the number of trials a process has run (issue 47).

Each simulated trial guards its folders as a bench trial's Environment does (repository, scratch, an extra folder)
and releases them when it ends. The lookup is `host_path.which("git")`, what every checkpoint's git call does.
For each N: how many folders are still guarded after N trials ended (0: a registration ends with its trial), and
the lookup's time with N trials' folders all guarded at once (N trials running, or main before the fix, which
never released one) against none, interleaved round by round in one process; the ratio should stay near 1.

    python benchmarks/bench_host_path.py [--trials 0,1000,10000] [--lookups 1000] [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from agent import host_path


def _time_lookups(n: int, reps: int = 5) -> float:
    """Median seconds per lookup over `reps` rounds of `n` lookups."""
    rounds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            host_path.which("git")
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def _trial_folders(i: int) -> tuple[Path, ...]:
    base = Path(f"/tmp/glm5-bench-host-path/trial-{i}")
    return base / "app", base / "scratch", base / "logs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="0,1000,10000")
    ap.add_argument("--lookups", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, done = [], 0
    for n in (int(x) for x in args.trials.split(",")):
        for i in range(done, n):  # trials that ran and ended: registered, then released, as Environment.close does
            host_path.guard(*_trial_folders(i)).release()
        done = max(done, n)
        left = len(host_path.guarded())
        # The same N trials all still running (or, before the fix, never released): the set's size, interleaved
        # round by round with the empty set so load from other jobs falls on both alike.
        live = frozenset(f for i in range(n) for f in _trial_folders(10**7 + i))
        empty_s, live_s = [], []
        for _ in range(args.rounds):
            host_path._guarded = frozenset()  # noqa: SLF001 - the benchmark swaps the snapshot a lookup reads
            empty_s.append(_time_lookups(args.lookups, reps=1))
            host_path._guarded = live  # noqa: SLF001
            live_s.append(_time_lookups(args.lookups, reps=1))
        host_path._guarded = frozenset(host_path._counts)  # noqa: SLF001 - back to the registrations'
        e, v = statistics.median(empty_s), statistics.median(live_s)
        rows.append({"trials": n, "guarded_after_they_ended": left, "lookup_us_none_live": e * 1e6,
                     "lookup_us_all_live": v * 1e6, "ratio": v / e})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'trials':>7} {'left guarded':>13} {'which(git) us, none live':>25} {'all live':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['trials']:>7} {r['guarded_after_they_ended']:>13} {r['lookup_us_none_live']:>25.1f} "
              f"{r['lookup_us_all_live']:>9.1f} {r['ratio']:>6.2f}")


if __name__ == "__main__":
    main()
