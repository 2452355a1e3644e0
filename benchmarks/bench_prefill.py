"""Prefill throughput: our GLM5ForCausalLM against transformers' GlmMoeDsaForCausalLM, same weights, same process.

    python benchmarks/bench_prefill.py [--preset small] [--tokens 512] [--reps 5] [--threads 2] [--warm 1]

Writes a random-initialised checkpoint with our `save_pretrained`, loads it in both implementations (fp32),
checks that they agree, then times two things, alternating the two implementations so that machine load hits
both alike:
  forward          the model's forward over one sequence, logits for every position (training, scoring);
                   our GLM5ForCausalLM vs GlmMoeDsaForCausalLM
  model prefill    a prefill through the model API, as transformers' generate() runs one: the prompt in, a KV
                   cache built, the last position's logits out. Both sides the same call: ours
                   GLM5ForCausalLM(ids, cache=KVCache, logits_to_keep=1), transformers
                   GlmMoeDsaForCausalLM(ids, use_cache=True, logits_to_keep=1). Ours runs its last layer for
                   the kept position only (its cache entries for every token)
  serving prefill  what a prefill is in serving: the prompt in, its KV cache written, the next token's
                   logits out. Ours: one step of the engine (serve/engine, paged latent cache, fused
                   projections; its last layer writes every token's cache entries but runs queries,
                   attention and MoE only for the sampled last token, whose logits are all a prefill
                   returns); transformers: its forward as generate() runs a prefill (use_cache=True,
                   logits_to_keep=1, every layer over every token)
For each it prints the median tokens/s, by wall clock and by process CPU time, and the ratios; the ratio of the
fastest runs by CPU time (on a shared machine, other load only ever adds time, so the minimum is the least
disturbed estimate); and the median ratio within back-to-back pairs (each repetition runs both, in alternating
order, so a pair saw the same machine: the estimate least moved by load that comes and goes during the run).
Each timed run follows an untimed run of the same side (--warm 1), as a model runs in use: right after the
other model, a side would first re-read its weights that the other's evicted from the shared cache.
It also prints which of glm5's fused CPU kernels are in use (model/kernels).
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
    ap.add_argument(
        "--warm",
        type=int,
        default=1,
        help="untimed runs of a side before its timed run in each repetition (0: time each run right after the "
        "other side's, which evicted its weights from the shared cache)",
    )
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

    # 1. The model's forward, logits for every position (what training and scoring compute).
    runs = {"ours": lambda: ours(ids), "transformers": lambda: hf(ids).logits}
    with torch.inference_mode():
        diff = (runs["ours"]() - runs["transformers"]()).abs().max().item()
    print(
        f"machine: {cpu_name()}, {args.threads} threads, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    from model import kernels

    print(kernels.status())
    print(
        f"transformers experts implementation: {hf.config._experts_implementation}, attention: {hf.config._attn_implementation}"
    )
    print(f"\n## forward, logits for every position ({args.preset}, {args.tokens} tokens, fp32, {args.reps} reps)")
    print(f"max |logit diff| {diff:.2e}")
    report(runs, args)

    # 2. A prefill through the model API, the call transformers' generate() makes: cache built, last logits.
    from model.kv_cache import KVCache

    def ours_model_prefill():
        return ours(ids, cache=KVCache.for_config(cfg), logits_to_keep=1)

    def hf_prefill():
        return hf(ids, use_cache=True, logits_to_keep=1).logits

    model_prefill = {"ours": ours_model_prefill, "transformers": hf_prefill}
    with torch.inference_mode():
        diff = (model_prefill["ours"]() - model_prefill["transformers"]()).abs().max().item()
    print(f"\n## model prefill: KV cache built, last position's logits ({args.tokens} tokens, fp32, {args.reps} reps)")
    print(f"max |logit diff| {diff:.2e}")
    report(model_prefill, args)

    # 3. Serving prefill: the prompt in, its KV cache written and the next token's logits out, which is what a
    # prefill is in serving. Ours: the engine's step (paged latent cache, fused projections, one chunk);
    # transformers: its forward as generate() runs a prefill (use_cache=True builds its cache, and
    # logits_to_keep=1 projects only the last position).
    from serve.engine import EngineConfig, LLMEngine, SamplingParams

    n = args.tokens
    engine = LLMEngine(
        ours,
        config=EngineConfig(
            max_num_seqs=1,
            block_size=16,
            num_kv_blocks=n // 16 + 4,
            max_num_batched_tokens=n,
            enable_prefix_caching=False,  # the same prompt every rep: a cache hit would skip the work
        ),
    )
    prompt = ids[0].tolist()

    def ours_prefill():
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=5))
        (out,) = engine.step()  # the whole prompt is one chunk: prefill, then the first token
        assert out.finished and not engine.has_unfinished, "the prefill took more than one step"
        return out

    serving = {"ours": ours_prefill, "transformers": hf_prefill}
    with torch.inference_mode():
        got = serving["ours"]().logprobs[0].top
        ref = torch.log_softmax(serving["transformers"]()[0, -1].float(), -1)
        want = dict(zip(*[t.tolist() for t in ref.topk(5)][::-1], strict=True))
    same_top = list(got) == list(want)
    lp_diff = max(abs(got[t] - want[t]) for t in want if t in got) if set(got) & set(want) else float("nan")
    print(f"\n## serving prefill: cache written, next-token logits ({args.tokens} tokens, fp32, {args.reps} reps)")
    print(f"top-5 next tokens identical: {same_top}; max |logprob diff| {lp_diff:.2e}")
    report(serving, args)


def gemm_probe_ms() -> float:
    """Median time of one fixed fp32 GEMM (512 x 768 @ 768 x 2048, hot): the machine's state at the moment. On
    this VM it reads ~9.2 ms when quiet; neighbours sharing the core push it to 10-12 ms, and they slow GEMM-bound
    code (ours: ~85% GEMM) more than code bound by per-op overhead (transformers)."""
    import torch

    a, b = torch.randn(512, 768), torch.randn(768, 2048)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same probe whatever the benchmark's thread count
    times = []
    for _ in range(21):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(threads)
    return statistics.median(times) * 1e3


def stream_gbs() -> float:
    """Best of 3 reads of a 512 MiB tensor, GB/s (one thread): DRAM bandwidth at the moment. Each forward streams
    ~800 MB of fp32 weights; when the VM's neighbours take memory bandwidth, GEMM-bound code (ours) slows more
    than overhead-bound code (transformers), which the hot GEMM probe does not show."""
    import torch

    x = torch.ones(128 * 2**20)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    torch.set_num_threads(threads)
    return x.numel() * 4 / best / 1e9


def report(runs: dict, args) -> None:
    """Times the runs alternately (machine load hits both alike) and prints tokens/s, ratios, fastest runs.

    Each repetition runs both sides, in alternating order, and each side `--warm` times untimed before its timed
    run: the two models are separate copies of ~800 MB of weights, and the one that just ran has evicted the
    other's from the machine's shared cache. A side timed right after the other (`--warm 0`) pays for that;
    ours, bound by its GEMMs' reads, pays more (measured: ~+100 ms against ~+10 ms for transformers). Run alone,
    as in use, neither does."""
    import torch

    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    with torch.inference_mode():
        for fn in runs.values():  # warm-up
            fn()
        load_before, probe_before, bw_before = os.getloadavg(), gemm_probe_ms(), stream_gbs()
        for rep in range(args.reps):
            order = list(runs.items()) if rep % 2 == 0 else list(runs.items())[::-1]  # neither always goes first
            for name, fn in order:
                for _ in range(args.warm):
                    fn()
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        load_after, probe_after, bw_after = os.getloadavg(), gemm_probe_ms(), stream_gbs()
    tps = {k: args.tokens / statistics.median(v) for k, v in times.items()}
    cpu_tps = {k: args.tokens / statistics.median(v) for k, v in cpu.items()}
    warm = f"each timed run after {args.warm} untimed run(s) of the same side" if args.warm else "no untimed runs"
    print(
        f"{warm}; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"GEMM probe {probe_before:.1f} ms before, {probe_after:.1f} ms after (~9.2 quiet); "
        f"DRAM read {bw_before:.1f} / {bw_after:.1f} GB/s"
    )
    for k in runs:
        ms = [round(t * 1e3) for t in times[k]]
        print(f"{k:>13}: {tps[k]:7.1f} tokens/s wall (runs {ms} ms); {cpu_tps[k]:7.1f} tokens per CPU-second")
    print(
        f"ratio ours / transformers: {tps['ours'] / tps['transformers']:.2f}x wall-clock, "
        f"{cpu_tps['ours'] / cpu_tps['transformers']:.2f}x CPU time (less sensitive to other load)"
    )
    best = {k: min(v) for k, v in cpu.items()}
    print(
        f"fastest run by CPU time: ours {best['ours'] * 1e3:.0f} ms, transformers {best['transformers'] * 1e3:.0f} ms, "
        f"ratio {best['transformers'] / best['ours']:.2f}x"
    )
    # Each repetition runs the two back to back, so a pair saw the same machine: the ratio within a pair is the
    # least sensitive to load that comes and goes over the run.
    pairs = sorted(t / o for t, o in zip(cpu["transformers"], cpu["ours"], strict=True))
    print(
        f"ratio within each back-to-back pair (CPU time): median {statistics.median(pairs):.2f}x, "
        f"range {pairs[0]:.2f}-{pairs[-1]:.2f}x"
    )


if __name__ == "__main__":
    main()
