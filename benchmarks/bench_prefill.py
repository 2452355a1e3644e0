"""Prefill throughput: our GLM5ForCausalLM against transformers' GlmMoeDsaForCausalLM, same weights, same process.

    python benchmarks/bench_prefill.py [--preset small] [--tokens 512] [--reps 5] [--threads 2]

Writes a random-initialised checkpoint with our `save_pretrained`, loads it in both implementations (fp32),
checks that the logits agree, then times full forward passes (logits for every position) over one sequence,
alternating the two so that machine load hits both alike. Prints the median tokens/s of each, by wall clock
and by process CPU time, and the ratios.
rms_norm_eps is set to 1e-6 so that both compute the same function (transformers hard-codes 1e-6 for
q_a/kv_a_layernorm, we follow rms_norm_eps as vLLM does).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    import transformers

    from model import GLM5ForCausalLM, preset

    torch.set_num_threads(args.threads)
    cfg = preset(args.preset).replace(rms_norm_eps=1e-6, dtype="float32")
    ours = GLM5ForCausalLM.from_config(cfg, seed=0).eval()
    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        transformers.logging.set_verbosity_error()  # it reports our MTP layer as unexpected: it has no MTP
        hf = transformers.GlmMoeDsaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size - 64, (1, args.tokens), generator=torch.Generator().manual_seed(0))

    runs = {"ours": lambda: ours(ids), "transformers": lambda: hf(ids).logits}
    with torch.inference_mode():
        diff = (runs["ours"]() - runs["transformers"]()).abs().max().item()
        times: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        load_before = os.getloadavg()
        for _ in range(args.reps):
            for name, fn in runs.items():
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        load_after = os.getloadavg()

    tps = {k: args.tokens / statistics.median(v) for k, v in times.items()}
    cpu_tps = {k: args.tokens / statistics.median(v) for k, v in cpu.items()}
    print(
        f"machine: {cpu_name()}, {args.threads} threads, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    print(
        f"transformers experts implementation: {hf.config._experts_implementation}, attention: {hf.config._attn_implementation}"
    )
    print(f"preset {args.preset}, {args.tokens} tokens, fp32, {args.reps} reps; max |logit diff| {diff:.2e}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    for k in runs:
        ms = [round(t * 1e3) for t in times[k]]
        print(f"{k:>13}: {tps[k]:7.1f} tokens/s wall (runs {ms} ms); {cpu_tps[k]:7.1f} tokens per CPU-second")
    print(
        f"ratio ours / transformers: {tps['ours'] / tps['transformers']:.2f}x wall-clock, "
        f"{cpu_tps['ours'] / cpu_tps['transformers']:.2f}x CPU time (less sensitive to other load)"
    )


if __name__ == "__main__":
    main()
