"""Torch threads under load: a training step of `glm5 finetune align-mtp` (the main job's slowest stage) with
torch's default threads (one per core, OpenMP's default spin-wait), one thread, two threads that sleep when they
wait, and glm5's own choice (glm5cli/threads.py), each on the machine as it is and under a load this script adds
(`--stress N` busy processes, stopped when the run ends; each also dies by itself after `--stress-limit` s).

    .venv/bin/python benchmarks/bench_threads.py [--rounds 2] [--steps 5] [--stress 4] \
        [--out benchmarks/bench_threads.json]

Each run is a fresh `python -m glm5cli finetune align-mtp` on a `tiny` checkpoint with 8 prompts of ~400
tokens (shorter than an agent session, so that a run takes a minute); the variants are interleaved per round so a
change in the other jobs' load falls on all of them. Reported: median seconds per training step (from the run's
own progress lines, the first step left out), the run's wall and CPU seconds, and the load average around it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "2 threads spinning (torch default)": {"OMP_NUM_THREADS": str(os.cpu_count() or 2)},
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "2 threads passive wait": {"OMP_NUM_THREADS": str(os.cpu_count() or 2), "OMP_WAIT_POLICY": "PASSIVE"},
    "glm5's choice": {},
}
_STEP = re.compile(r"step (\d+)/\d+ .*?([0-9.]+) s/step")


def _setup(work: Path) -> tuple[Path, Path]:
    ckpt = work / "tiny"
    subprocess.run([sys.executable, "-m", "glm5cli", "model", "init", "--preset", "tiny", "--out", str(ckpt)],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    text = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(30))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{k} {text}"}) + "\n" for k in range(8)))
    return ckpt, prompts


def _run(ckpt: Path, prompts: Path, out: Path, steps: int, extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra)
    cmd = [sys.executable, "-m", "glm5cli", "finetune", "align-mtp", str(ckpt), "--out", str(out), "--prompts",
           str(prompts), "--steps", str(steps), "--max-new-tokens", "8", "--batch-size", "8", "--save-every", "0",
           "--draft-vocab-size", "0"]  # fmt: skip
    load0, t0, cpu0 = os.getloadavg()[0], time.perf_counter(), os.times()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, cpu1 = time.perf_counter() - t0, os.times()
    if p.returncode != 0:
        raise RuntimeError(f"align-mtp failed ({p.returncode}): {p.stderr[-2000:]}")
    per_step = [float(s) for n, s in _STEP.findall(p.stderr) if int(n) > 1]
    return {"s_per_step": statistics.median(per_step), "steps": per_step, "wall_s": round(wall, 2),
            "cpu_s": round(cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system, 2),
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}  # fmt: skip


def _stress(n: int, limit: int) -> list[subprocess.Popen]:
    """`n` busy processes, each bounded by `limit` seconds (coreutils timeout) should this script be killed."""
    code = "while True: pass"
    return [subprocess.Popen(["timeout", str(limit), sys.executable, "-c", code]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--stress", type=int, default=4, help="busy processes for the loaded runs (0: skip them)")
    ap.add_argument("--stress-limit", type=int, default=900, help="each busy process ends after this many s")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from VARIANTS")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "bench_threads.json")
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="glm5-threads-") as tmp:
        work = Path(tmp)
        ckpt, prompts = _setup(work)
        for rnd in range(args.rounds):
            for loaded in ([False, True] if args.stress else [False]):
                busy = _stress(args.stress, args.stress_limit) if loaded else []
                try:
                    if busy:
                        time.sleep(60)  # the 1-minute load average then shows most of them, as a steady load does
                    for name in names:
                        r = _run(ckpt, prompts, work / f"out-{rnd}-{loaded}-{len(rows)}", args.steps, VARIANTS[name])
                        rows.append({"round": rnd, "stress": len(busy), "variant": name, **r})
                        print(json.dumps(rows[-1]), flush=True)
                finally:
                    _stop(busy)
    summary: dict[str, dict[str, float]] = {}
    for r in rows:
        key = f"stress {r['stress']}"
        summary.setdefault(key, {}).setdefault(r["variant"], []).append(r["s_per_step"])
    summary = {k: {v: round(statistics.median(x), 3) for v, x in d.items()} for k, d in summary.items()}
    result = {"cpus": os.cpu_count(), "summary_median_s_per_step": summary, "runs": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
