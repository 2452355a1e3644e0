"""SFT step time at 1 vs 2 processes on the same global batch: one plain process (all the machine's threads)
against `torchrun --nproc-per-node 2` with FSDP2 (gloo; each rank gets its share of the threads), LoRA on the
same checkpoint, data and batch. Runs are interleaved (1, 2, 1, 2, ...) so that both sides see the same machine
load; `uptime` before and after goes in the JSON. A plain process at one thread is timed too: on a loaded
machine a process whose two OpenMP threads wait on each other at every barrier can be far slower than two
single-threaded ranks, which says more about the load than about FSDP. Writes benchmarks/bench_sft_distributed.json.

    .venv/bin/python benchmarks/bench_sft_distributed.py [--preset tiny] [--steps 6] [--rounds 2] [--len 256]

Timed: the median wall time of the steps after the first (warm-up) in each run; the ratio is the 2-process
step time over the 1-process one of the same round. On CPU two ranks only split the work the cores already
shared: expect no speed-up on a 2-core machine, only FSDP's communication and the gradient sync on top. The
point of the 2-process path is more accelerators, where each rank has its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).absolute().parents[1]
sys.path.insert(0, str(ROOT))


def worker(args) -> None:
    """One run (a plain process, or each rank under torchrun): LoRA SFT for --steps, step times to --out."""
    import torch

    from benchmarks.bench_sft import make_data
    from finetune.distributed import Distributed
    from finetune.lora import LoraSettings, add_lora
    from finetune.sft import SFTConfig, train_sft
    from finetune.train_loop import OptimConfig
    from model import GLM5ForCausalLM

    dist = Distributed.from_env()
    if dist is not None:
        dist.init()
    model = add_lora(GLM5ForCausalLM.from_pretrained(args.ckpt, dtype=torch.float32), LoraSettings(rank=16))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if dist is not None:
        named = dist.shard(model, named)
    data = make_data(args.seqs, args.len, model.config.vocab_size)
    seconds: list[float] = []
    cfg = SFTConfig(OptimConfig(steps=args.steps, lr=1e-4, warmup=1), batch_size=args.batch)
    hist = train_sft(model, data, cfg, named=named, dist=dist, on_step=lambda info: seconds.append(info.seconds))
    if dist is None or dist.is_main:
        out = {"seconds": seconds, "losses": [h.lm for h in hist], "threads": torch.get_num_threads()}
        Path(args.out).write_text(json.dumps(out))
    if dist is not None:
        dist.close()


def run(nproc: int, ckpt: Path, args, out: Path, threads: int | None = None) -> dict:
    """One timed run: a plain process (`threads`: its OMP_NUM_THREADS, default torch's: every core), or
    torchrun with `nproc` ranks sharing the cores."""
    common = [str(Path(__file__).absolute()), "--worker", "--ckpt", str(ckpt), "--out", str(out)]
    common += ["--steps", str(args.steps), "--seqs", str(args.seqs), "--len", str(args.len)]
    common += ["--batch", str(args.batch)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if nproc == 1:
        cmd = [sys.executable, *common]
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--master-port={port}"]
        cmd += common
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return json.loads(out.read_text())


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json", type=Path, default=Path(__file__).with_name("bench_sft_distributed.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    from benchmarks.bench_sft import make_checkpoint

    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_checkpoint(args.preset, Path(tmp) / "ckpt")
        for r in range(args.rounds):
            one = run(1, ckpt, args, Path(tmp) / f"one{r}.json")
            one_1t = run(1, ckpt, args, Path(tmp) / f"one1t{r}.json", threads=1)
            two = run(2, ckpt, args, Path(tmp) / f"two{r}.json")
            s1, s1t, s2 = (statistics.median(x["seconds"][1:]) for x in (one, one_1t, two))
            rel = max(abs(a - b) / abs(b) for a, b in zip(two["losses"], one["losses"], strict=True))
            rounds.append(
                {
                    "one_s": s1,
                    "one_threads": one["threads"],
                    "one_1thread_s": s1t,
                    "two_s": s2,
                    "two_over_one": s2 / s1,
                    "two_over_one_1thread": s2 / s1t,
                    "max_rel_loss_diff": rel,
                }
            )
            print(
                f"round {r}: 1 process {s1:.3f} s/step ({one['threads']} threads), 1 process 1 thread {s1t:.3f}, "
                f"2 processes {s2:.3f} s/step ({s2 / s1:.2f}x, {s2 / s1t:.2f}x)",
                flush=True,
            )
    result = {
        "preset": args.preset,
        "steps": args.steps,
        "batch": args.batch,
        "len": args.len,
        "rounds": rounds,
        "two_over_one_median": statistics.median(r["two_over_one"] for r in rounds),
        "two_over_one_1thread_median": statistics.median(r["two_over_one_1thread"] for r in rounds),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "uptime_before": uptime_before,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
