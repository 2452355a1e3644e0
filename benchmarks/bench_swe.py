"""glm5 bench: the built-in SWE suite with the oracle at -n 4 (target < 60 s on the 2-core machine), and the
local environment's overhead per trial: fresh clone + sandboxed command + patch capture + cleanup (target < 2 s).

    .venv/bin/python benchmarks/bench_swe.py [--repeats 10] [--out benchmarks/bench_swe.json] [--docker]

With --docker (a daemon answering, glm5's base image built: scripts/build_base_image.sh), the same parts for the
docker environment (a container of the base image per trial, /app bind-mounted), and whole oracle trials of the
same tasks in both environments: docker mode's per-trial overhead against local mode.

The overhead is measured on a warm cache (the suite's mirror exists), as every trial after the first sees it;
the bare `bash -c true` beside the sandboxed one shows what bubblewrap itself costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.bench.agents import OracleAgent  # noqa: E402
from agent.bench.environments import EnvSpec  # noqa: E402
from agent.bench.job import load_tasks, run_job  # noqa: E402
from agent.bench.local_env import LocalEnvironment  # noqa: E402
from agent.bench.repos import RepoCache, working_tree_diff  # noqa: E402
from agent.bench.runner import RunOptions  # noqa: E402


def suite_run(work: Path, n: int) -> dict:
    tasks, source, _ = load_tasks("swe", [], "builtin", work / "suite")
    t0 = time.perf_counter()
    report = run_job("swe", tasks, OracleAgent(), work / "run", RunOptions(concurrency=n, source=source))
    wall = time.perf_counter() - t0
    s = report["summary"]
    return {"tasks": s["tasks"], "resolved": s["resolved"], "infra_errors": s["infra_errors"], "concurrency": n,
            "wall_s": round(wall, 2), "target_s": 60, "mean_trial_s": s["seconds_per_trial"]}  # fmt: skip


def overhead(work: Path, repeats: int) -> dict:
    tasks, _, _ = load_tasks("swe", [], "builtin", work / "suite")
    task = tasks[0]
    repos = RepoCache(work / "cache")
    repos.mirror(task.repo)  # warm, as for every trial but the first
    parts: dict[str, list[float]] = {"start": [], "exec_true": [], "diff": [], "cleanup": [], "total": []}
    bare = []
    for i in range(repeats):
        t0 = time.perf_counter()
        env = LocalEnvironment(
            EnvSpec(work / "trials" / str(i), app_source=lambda d: repos.checkout(task.repo, task.base_commit, d))
        )
        env.start()
        t1 = time.perf_counter()
        assert env.exec("true").returncode == 0
        t2 = time.perf_counter()
        working_tree_diff(env.app_dir, task.base_commit)
        t3 = time.perf_counter()
        shutil.rmtree(work / "trials" / str(i))
        t4 = time.perf_counter()
        for k, v in (
            ("start", t1 - t0),
            ("exec_true", t2 - t1),
            ("diff", t3 - t2),
            ("cleanup", t4 - t3),
            ("total", t4 - t0),
        ):
            parts[k].append(v)
        b0 = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=True)
        bare.append(time.perf_counter() - b0)
    out = {k: round(statistics.median(v), 4) for k, v in parts.items()}
    out["bare_bash_true"] = round(statistics.median(bare), 4)
    out["sandbox_over_bare"] = round(out["exec_true"] / out["bare_bash_true"], 1)
    out["repeats"] = repeats
    out["target_s"] = 2.0
    return out


def docker_overhead(work: Path, repeats: int) -> dict:
    """The local overhead's parts for DockerEnvironment: start (container up), `true`, diff, stop + cleanup."""
    from agent.bench.docker_env import BASE_IMAGE, DockerEnvironment

    tasks, _, _ = load_tasks("swe", [], "builtin", work / "suite")
    task = tasks[0]
    repos = RepoCache(work / "cache")
    repos.mirror(task.repo)
    parts: dict[str, list[float]] = {"start": [], "exec_true": [], "diff": [], "cleanup": [], "total": []}
    for i in range(repeats):
        t0 = time.perf_counter()
        spec = EnvSpec(work / "trials" / str(i), image=BASE_IMAGE,
                       app_source=lambda d: repos.checkout(task.repo, task.base_commit, d))  # fmt: skip
        env = DockerEnvironment(spec)
        env.start()
        t1 = time.perf_counter()
        assert env.exec("true").returncode == 0
        t2 = time.perf_counter()
        working_tree_diff(env.app_dir, task.base_commit)
        t3 = time.perf_counter()
        env.stop()
        shutil.rmtree(work / "trials" / str(i))
        t4 = time.perf_counter()
        for k, v in (("start", t1 - t0), ("exec_true", t2 - t1), ("diff", t3 - t2), ("cleanup", t4 - t3),
                     ("total", t4 - t0)):  # fmt: skip
            parts[k].append(v)
    out = {k: round(statistics.median(v), 4) for k, v in parts.items()}
    out["repeats"] = repeats
    return out


def trials_both_ways(work: Path, count: int) -> dict:
    """Whole oracle trials (agent, patch, grading in a fresh environment) of the same tasks, local then docker,
    interleaved task by task: seconds per trial, median."""
    from agent.bench.trial import TrialConfig, run_trial

    tasks, _, _ = load_tasks("swe", [], "builtin", work / "suite")
    times: dict[str, list[float]] = {"local": [], "docker": []}
    resolved: dict[str, int] = {"local": 0, "docker": 0}
    repos = RepoCache(work / "cache")
    for t in tasks[:count]:
        for kind in ("local", "docker"):
            cfg = TrialConfig(env=kind, cache_dir=work / "cache", repos=repos)
            r = run_trial(t, OracleAgent(), work / kind / t.instance_id, cfg)
            times[kind].append(r.seconds)
            resolved[kind] += bool(r.resolved)
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    return {"tasks": count, "median_trial_s": med, "resolved": resolved,
            "docker_over_local_s": round(med["docker"] - med["local"], 3)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("bench_swe.json"))
    ap.add_argument("--docker", action="store_true", help="also measure docker mode against local mode")
    ap.add_argument("--trials", type=int, default=4, help="--docker: oracle trials per environment")
    args = ap.parse_args()
    docker = None
    with tempfile.TemporaryDirectory(prefix="glm5-bench-swe-") as tmp:
        work = Path(tmp)
        suite = suite_run(work / "a", args.n)
        print(f"built-in SWE suite, oracle, -n {args.n}: {suite['resolved']}/{suite['tasks']} resolved in "
              f"{suite['wall_s']} s (target < 60 s: {suite['wall_s'] / 60:.2f} of it)")  # fmt: skip
        ov = overhead(work / "b", args.repeats)
        print(f"local environment per trial (median of {args.repeats}): {ov['total']} s (target < 2 s) = start "
              f"{ov['start']} + sandboxed `true` {ov['exec_true']} ({ov['sandbox_over_bare']}x bare bash) + diff "
              f"{ov['diff']} + cleanup {ov['cleanup']}")  # fmt: skip
        if args.docker:
            from agent.bench.docker_env import docker_problem

            why = docker_problem()
            if why:
                raise SystemExit(f"--docker: {why}")
            dov = docker_overhead(work / "c", args.repeats)
            both = trials_both_ways(work / "d", args.trials)
            docker = {"env_overhead": dov, "trials": both}
            print(f"docker environment per trial (median of {args.repeats}): {dov['total']} s = start {dov['start']}"
                  f" + `true` {dov['exec_true']} + diff {dov['diff']} + stop/cleanup {dov['cleanup']}")  # fmt: skip
            print(f"whole oracle trials, median of {both['tasks']}: local {both['median_trial_s']['local']} s, "
                  f"docker {both['median_trial_s']['docker']} s (+{both['docker_over_local_s']} s); resolved "
                  f"{both['resolved']}")  # fmt: skip
    result = {"suite_oracle": suite, "local_env_overhead": ov, "docker_vs_local": docker,
              "machine": {"cpus": os.cpu_count(),
              "python": platform.python_version(), "load_avg_1m": round(os.getloadavg()[0], 2)}}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
