"""A trial's checkout: the per-commit snapshot (`RepoCache.checkout`: the base commit's history taken from the
mirror once, then copied per trial) against repacking each trial's clone (`git clone --shared`, drop the refs,
`git repack -a -d`, drop the alternates: what each trial did before), in the same run, on the same repository.

Both give a clone that holds the base commit's history and nothing newer, and that works with the cache hidden.
The cost of each grows with the repository's history; the snapshot's is paid once per base commit (a bench's
attempts and an RL group's samples share it), the repack's on every trial.

    python benchmarks/bench_trial_checkout.py [--repo PATH] [--commit REV] [--trials 6] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from agent.bench.repos import RepoCache
from agent.git_safe import git


def _repack_checkout(mirror: Path, commit: str, dest: Path) -> None:
    git(dest.parent, "clone", "--shared", "--no-checkout", "--quiet", str(mirror), str(dest))
    git(dest, "checkout", "--quiet", "--detach", commit)
    for ref in git(dest, "for-each-ref", "--format=%(refname)").stdout.split():
        git(dest, "update-ref", "--no-deref", "-d", ref)
    git(dest, "reflog", "expire", "--expire=now", "--all")
    git(dest, "repack", "-a", "-d", "-q")
    (dest / ".git" / "objects" / "info" / "alternates").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--commit", default="HEAD~20")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", args.repo, "rev-parse", args.commit], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="glm5-bench-checkout-"))
    try:
        cache = RepoCache(work / "cache")
        mirror = cache.mirror(args.repo)
        objects = git(mirror, "count-objects", "-v", env={"GIT_DIR": str(mirror)}).stdout
        t0 = time.perf_counter()
        cache.snapshot(args.repo, commit)
        snap_s = time.perf_counter() - t0
        ours, theirs = [], []
        for i in range(args.trials):  # interleaved, so load from other jobs falls on both alike
            t0 = time.perf_counter()
            cache.checkout(args.repo, commit, work / f"ours-{i}")
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _repack_checkout(mirror, commit, work / f"repack-{i}")
            theirs.append(time.perf_counter() - t0)
        row = {"repo": args.repo, "objects": objects.split("in-pack: ")[1].split()[0],
               "snapshot_once_s": snap_s, "checkout_s": statistics.median(ours),
               "repack_checkout_s": statistics.median(theirs),
               "speedup": statistics.median(theirs) / statistics.median(ours)}  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(row, indent=2))
        return
    print(f"{row['repo']} ({row['objects']} objects): snapshot once {snap_s:.2f} s; per trial: snapshot copy "
          f"{row['checkout_s']:.2f} s, repack {row['repack_checkout_s']:.2f} s ({row['speedup']:.1f}x)")


if __name__ == "__main__":
    main()
