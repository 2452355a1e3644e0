"""INT4 weight-only benchmark on the `small` preset: accuracy, weight memory and decode speed against fp32.

    python benchmarks/bench_int4.py [--steps 300] [--threads 1] [--out benchmarks/results_int4.json]

1. Train the `small` preset (fp32) for `--steps` steps on text, so that the comparison is made on weights that
   predict something (random weights make top-1 agreement meaningless). The text is the source of a fixed list
   of Python standard-library modules, byte-level tokens (ids 0..255), last 10% held out. The trained
   checkpoint is cached in `--cache` and reused by later runs.
2. Accuracy on `--positions` held-out positions (teacher forcing): greedy top-1 agreement of int4 with fp32 and
   perplexity, for g128 symmetric (the target: >= 95% agreement, perplexity within 5%) and other variants.
   g128 is measured twice: swapped in by `quantize_int4`, and written with `quantize_checkpoint`
   (compressed-tensors pack-quantized) and loaded with `GLM5ForCausalLM.from_pretrained`; the two must agree.
3. Weight bytes: the quantized linears (int4 + scales) against the same weights in bf16, and the whole model.
4. Decode tokens/s at batch 1 and 16 with a KV cache, fp32 vs int4 (fast kernels: on CPU the one this machine
   chooses, `model.kernels.int4.cpu_kernel`) vs int4 on torch's tinygemm kernel (where that is not the one
   chosen) vs int4 plain path, interleaved in rounds in the same process; best and median of the rounds (the
   machine may be shared).

`--profile` instead profiles batch-1 decode steps of fp32 and int4 (torch.profiler, the top ops by self CPU time
per token), to see what bounds INT4 on a given CPU; `--gemv-only` times single linears at fixed shapes.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.config import preset  # noqa: E402
from model.int4_linear import Int4Linear  # noqa: E402
from model.int4_write import quantize_checkpoint  # noqa: E402
from model.kernels import int4 as int4_kernel  # noqa: E402
from model.kv_cache import KVCache  # noqa: E402
from model.modeling import GLM5ForCausalLM  # noqa: E402
from model.quant_int4 import quantize_int4  # noqa: E402


def tinygemm_int4(build):
    """`build()` with fast CPU layers on torch's tinygemm kernel, whatever this machine would choose."""
    before = os.environ.get("GLM5_INT4_CPU_KERNEL")
    os.environ["GLM5_INT4_CPU_KERNEL"] = "tinygemm"
    try:
        return build()
    finally:
        os.environ.pop("GLM5_INT4_CPU_KERNEL")
        if before is not None:
            os.environ["GLM5_INT4_CPU_KERNEL"] = before


CORPUS_MODULES = (
    "argparse", "textwrap", "json.decoder", "json.encoder", "pathlib", "shlex", "difflib", "string",
    "fractions", "heapq", "bisect", "functools", "statistics", "calendar", "configparser", "csv", "dataclasses",
    "enum", "gettext", "glob", "inspect", "ipaddress", "locale", "logging", "optparse", "pprint", "queue",
    "random", "sched", "secrets", "selectors", "shutil", "socketserver", "tempfile", "threading", "timeit",
    "tokenize", "traceback", "typing", "uuid", "warnings", "weakref", "zipfile",
)  # fmt: skip


def corpus_ids() -> torch.Tensor:
    text = "\n\n".join(inspect.getsource(importlib.import_module(m)) for m in CORPUS_MODULES)
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def train(cfg, ids: torch.Tensor, steps: int, batch: int, seq: int, lr: float, seed: int) -> GLM5ForCausalLM:
    torch.manual_seed(seed)
    model = GLM5ForCausalLM.from_config(cfg, seed=seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for step in range(steps):
        warm = min(1.0, (step + 1) / 20)
        for g in opt.param_groups:
            g["lr"] = lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=gen)
        x = torch.stack([ids[s : s + seq + 1] for s in starts.tolist()])
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == steps - 1:
            print(f"  step {step:4d} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    return model.eval()


@torch.no_grad()
def eval_logits(model, eval_ids: torch.Tensor) -> torch.Tensor:
    return model(eval_ids[None, :-1])[0].float()


def accuracy(ref_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> dict:
    ppl = math.exp(F.cross_entropy(logits, targets).item())
    return {
        "top1_agreement": (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item(),
        "ppl": ppl,
        "max_abs_logit_diff": (logits - ref_logits).abs().max().item(),
    }


def weight_report(model) -> dict:
    q_elems = q_bytes = dense_elems = dense_bytes = 0
    for m in model.modules():
        if isinstance(m, Int4Linear):
            q_elems += m.in_features * m.out_features
            q_bytes += m.weight_bytes()
    for p in model.parameters():
        dense_elems += p.numel()
        dense_bytes += p.numel() * p.element_size()
    return {
        "int4_linears_bytes": q_bytes,
        "int4_linears_vs_bf16": q_bytes / (2 * q_elems) if q_elems else None,
        "model_bytes": q_bytes + dense_bytes,
        "model_vs_bf16": (q_bytes + dense_bytes) / (2 * (q_elems + dense_elems)),
        "high_precision_params": dense_elems,
    }


@torch.inference_mode()  # as the engine runs: no autograd bookkeeping at all (no_grad still counts versions)
def decode_tps(model, cfg, batch: int, prompt: int, tokens: int, seed: int = 0) -> tuple[float, float]:
    """-> (tokens per wall-clock second, tokens per CPU second of this process).

    With one thread the CPU-time rate is what the work costs, without the time spent waiting for a core that
    other processes hold; both are reported."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (batch, prompt), generator=gen)
    cache = KVCache.for_config(cfg)
    tok = model(ids, cache=cache)[:, -1:].argmax(-1)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(tokens):
        tok = model(tok, cache=cache)[:, -1:].argmax(-1)
    return batch * tokens / (time.perf_counter() - t), batch * tokens / (time.process_time() - c)


def engine_decode(fp32, int4, prompt: int, tokens: int, rounds: int) -> dict:
    """Batch-1 decode tokens/s of the embedded engine on the fp32 and the INT4 model, interleaved rounds; per
    wall-clock second and per CPU second of this process (on a shared machine the CPU-time ratio is the one
    that holds)."""
    from serve.engine import EngineConfig, LLMEngine, SamplingParams

    engines = {
        name: LLMEngine(m, config=EngineConfig(max_num_seqs=1, num_kv_blocks=64, block_size=16))
        for name, m in (("fp32", fp32), ("int4", int4))
    }
    runs: dict[str, list[float]] = {name: [] for name in engines}
    cpu_runs: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(rounds + 1):
        ids = torch.randint(0, 256, (prompt,), generator=torch.Generator().manual_seed(r)).tolist()
        for name, eng in engines.items():
            eng.add_request(ids, SamplingParams(temperature=0.0, max_tokens=tokens + 1, ignore_eos=True))
            eng.step()  # prefill
            t, c = time.perf_counter(), time.process_time()
            while eng.has_unfinished:
                eng.step()
            if r:  # round 0 warms up (fusion, allocator)
                runs[name].append(tokens / (time.perf_counter() - t))
                cpu_runs[name].append(tokens / (time.process_time() - c))
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu_runs.items()}
    return {"tokens_per_s_median": med, "runs": runs, "int4_vs_fp32_median": med["int4"] / med["fp32"],
            "tokens_per_cpu_s_median": cpu_med, "cpu_runs": cpu_runs,
            "int4_vs_fp32_cpu_time": cpu_med["int4"] / cpu_med["fp32"]}  # fmt: skip


# (name, out_features N, in_features K): the small preset's decode linears and GLM-5's real expert shapes.
GEMV_SHAPES = (
    ("small expert gate/up", 256, 768),
    ("small expert down", 768, 256),
    ("small dense MLP up", 2048, 768),
    ("small lm_head (kept fp32)", 8192, 768),
    ("glm5 expert gate/up", 2048, 6144),
    ("glm5 expert down", 6144, 2048),
)


def gemv_bench(batch: int, working_set: int = 256 * 2**20, calls: int = 64) -> list[dict]:
    """CPU time per linear call, fp32 `F.linear` vs `Int4Linear` (fast, g128), cycling through enough copies
    of the weight that each side's working set exceeds the caches, as in a decode step over a real model."""
    from model.compressed_tensors import Int4Tensors

    rows = []
    for name, n, k in GEMV_SHAPES:
        x = torch.randn(batch, k)
        fp32 = [torch.randn(n, k) for _ in range(max(1, -(-working_set // (4 * n * k))))]
        qs = [
            Int4Tensors(torch.randint(-8, 8, (n, k), dtype=torch.int8), torch.rand(n, k // 128) / 100, None, 128)
            for _ in range(max(1, -(-working_set // (n * k // 2))))
        ]
        int4 = [Int4Linear(t) for t in qs]

        def per_call(fn, weights) -> float:
            for w in weights[:4]:
                fn(w)
            c = time.process_time()
            for i in range(calls):
                fn(weights[i % len(weights)])
            return (time.process_time() - c) / calls * 1e6

        tg = None
        if int4[0].cpu_kernel != "tinygemm":  # the kernel the machine did not choose, for comparison
            tg = tinygemm_int4(lambda qs=qs: [Int4Linear(t) for t in qs])
        with torch.no_grad():
            t_fp32 = per_call(lambda w, x=x: F.linear(x, w), fp32)
            t_int4 = per_call(lambda m, x=x: m(x), int4)
            t_tg = per_call(lambda m, x=x: m(x), tg) if tg else None
        row = {"layer": name, "N": n, "K": k, "batch": batch, "fp32_us": t_fp32, "int4_us": t_int4,
               "speedup": t_fp32 / t_int4, "int4_kernel": int4[0].cpu_kernel}  # fmt: skip
        if t_tg:
            row.update(int4_tinygemm_us=t_tg, tinygemm_speedup=t_fp32 / t_tg)
        rows.append(row)
        tg_note = f", tinygemm {t_tg:.0f} us" if t_tg else ""
        print(f"  gemv {name} [{n}x{k}] batch {batch}: fp32 {t_fp32:.0f} us, int4 {t_int4:.0f} us{tg_note}",
              flush=True)  # fmt: skip
        del fp32, int4, tg, qs
    return rows


@torch.inference_mode()
def profile_decode(models: dict, prompt: int, steps: int = 8, top: int = 8) -> dict:
    """Per model: the ops with the most self CPU time over `steps` batch-1 decode steps, per token."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    ids = torch.randint(0, 256, (1, prompt), generator=torch.Generator().manual_seed(0))
    for name, m in models.items():
        cache = KVCache.for_config(m.config)
        tok = m(ids, cache=cache)[:, -1:].argmax(-1)
        for _ in range(3):  # warm-up
            tok = m(tok, cache=cache)[:, -1:].argmax(-1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                tok = m(tok, cache=cache)[:, -1:].argmax(-1)
        events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in events)
        out[name] = {
            "self_cpu_ms_per_token": total / steps / 1e3,
            "top": [
                {
                    "op": e.key,
                    "ms_per_token": e.self_cpu_time_total / steps / 1e3,
                    "calls_per_token": e.count // steps,
                    "share": e.self_cpu_time_total / total,
                }
                for e in events[:top]
            ],  # fmt: skip
        }
        print(f"  {name}: {out[name]['self_cpu_ms_per_token']:.1f} ms self CPU per token", flush=True)
        for row in out[name]["top"]:
            print(f"    {row['op']:40s} {row['ms_per_token']:7.2f} ms  {row['calls_per_token']:4d} calls  "
                  f"{100 * row['share']:4.1f}%", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    # One thread by default: on a shared 2-core machine two OpenMP threads spin against other processes and
    # run 10-20x slower than one (measured); pass --threads 0 for torch's default.
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "glm5-small-trained")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results_int4.json"))
    ap.add_argument("--gemv-only", action="store_true", help="only the per-layer linear timings")
    ap.add_argument("--profile", action="store_true", help="only a profile of batch-1 decode, fp32 and int4")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gemv_only:
        rows = [r for b in (1, 16) for r in gemv_bench(b)]
        out = args.out.with_name("results_int4_gemv.json")
        out.write_text(json.dumps({"threads": torch.get_num_threads(), "gemv": rows}, indent=2) + "\n")
        print(f"wrote {out}")
        return
    torch.set_flush_denormal(True)
    cfg = preset("small")
    results: dict = {
        "preset": "small",
        "threads": torch.get_num_threads(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }

    ids = corpus_ids()
    split = int(len(ids) * 0.9)
    train_ids, eval_ids = ids[:split], ids[split : split + args.positions + 1]
    results["corpus_bytes"] = len(ids)
    marker = args.cache / "trained.json"
    if marker.is_file() and json.loads(marker.read_text()).get("steps") == args.steps:
        print(f"reusing trained checkpoint {args.cache}", flush=True)
    else:
        print(f"training small for {args.steps} steps (batch {args.batch} x {args.seq} bytes)", flush=True)
        t = time.perf_counter()
        model = train(cfg, train_ids, args.steps, args.batch, args.seq, args.lr, seed=0)
        results["train_seconds"] = time.perf_counter() - t
        model.save_pretrained(args.cache)
        marker.write_text(json.dumps({"steps": args.steps}))
        del model
    fp32 = GLM5ForCausalLM.from_pretrained(args.cache, dtype=torch.float32)
    if args.profile:
        int4 = quantize_int4(copy.deepcopy(fp32), group_size=128)
        results["profile_batch1"] = profile_decode({"fp32": fp32, "int4": int4}, args.prompt)
        out = args.out.with_name("results_int4_profile.json")
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {out}")
        return

    # ---- accuracy
    targets = eval_ids[1:]
    ref = eval_logits(fp32, eval_ids)
    acc = {"fp32": accuracy(ref, ref, targets)}
    variants = {"int4_g128_sym": (128, True), "int4_g128_asym": (128, False), "int4_g64_sym": (64, True),
                "int4_g32_sym": (32, True)}  # fmt: skip
    int4_g128 = None
    for name, (gs, sym) in variants.items():
        m = quantize_int4(copy.deepcopy(fp32), group_size=gs, symmetric=sym)
        acc[name] = accuracy(ref, eval_logits(m, eval_ids), targets)
        if name == "int4_g128_sym":
            int4_g128 = m
            results["weights"] = {"fp32": weight_report(fp32), "int4_g128_sym": weight_report(m)}
        print(f"  {name}: {acc[name]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        summary = quantize_checkpoint(args.cache, Path(tmp) / "q", group_size=128)
        loaded = GLM5ForCausalLM.from_pretrained(Path(tmp) / "q", dtype=torch.float32)
        ck_logits = eval_logits(loaded, eval_ids)
        acc["int4_g128_sym_checkpoint"] = accuracy(ref, ck_logits, targets)
        acc["int4_g128_sym_checkpoint"]["checkpoint_bytes"] = summary["bytes_out"]
        acc["int4_g128_sym_checkpoint"]["source_bytes_fp32"] = summary["bytes_in"]
        acc["int4_g128_sym_checkpoint"]["same_logits_as_quantize_int4"] = bool(
            torch.allclose(ck_logits, eval_logits(int4_g128, eval_ids), atol=1e-4)
        )
        del loaded
    results["accuracy"] = acc
    a = acc["int4_g128_sym"]
    results["targets"] = {
        "top1_agreement_ge_0.95": a["top1_agreement"] >= 0.95,
        "ppl_within_5pct": a["ppl"] <= 1.05 * acc["fp32"]["ppl"],
        "int4_linears_weight_bytes_le_0.30_bf16": results["weights"]["int4_g128_sym"]["int4_linears_vs_bf16"] <= 0.30,
    }

    # ---- decode speed
    plain = quantize_int4(copy.deepcopy(fp32), group_size=128, impl="plain")
    models = {"fp32": fp32, "int4": int4_g128, "int4_plain": plain}
    results["int4_cpu_kernel"] = int4_kernel.status()
    print(f"  {results['int4_cpu_kernel']}", flush=True)
    if int4_kernel.cpu_kernel() != "tinygemm":  # torch's kernel as a peer, in the same rounds
        models["int4_tinygemm"] = tinygemm_int4(lambda: quantize_int4(copy.deepcopy(fp32), group_size=128))
    speed: dict = {}
    for batch in (1, 16):
        runs: dict[str, list[float]] = {name: [] for name in models}
        cpu_runs: dict[str, list[float]] = {name: [] for name in models}
        for m in models.values():  # warm-up, not timed (allocator, caches, the first calls' set-up)
            decode_tps(m, cfg, batch, args.prompt, 4, seed=99)
        for r in range(args.rounds):
            for name, m in models.items():
                wall, cpu = decode_tps(m, cfg, batch, args.prompt, args.decode_tokens, seed=r)
                runs[name].append(wall)
                cpu_runs[name].append(cpu)
        med = {k: statistics.median(v) for k, v in runs.items()}
        best = {k: max(v) for k, v in runs.items()}
        cpu_med = {k: statistics.median(v) for k, v in cpu_runs.items()}
        speed[f"batch{batch}"] = {
            "tokens_per_s_median": med,
            "tokens_per_s_best": best,
            "tokens_per_cpu_s_median": cpu_med,
            "runs": runs,
            "cpu_runs": cpu_runs,
            "int4_vs_fp32_median": med["int4"] / med["fp32"],
            # Best-of-rounds: on a shared machine the fastest round is the one least disturbed by other work.
            "int4_vs_fp32_best": best["int4"] / best["fp32"],
            "int4_vs_fp32_cpu_time": cpu_med["int4"] / cpu_med["fp32"],
        }
        if "int4_tinygemm" in cpu_med:
            speed[f"batch{batch}"]["int4_vs_tinygemm_cpu_time"] = cpu_med["int4"] / cpu_med["int4_tinygemm"]
        print(f"  decode batch {batch}: {speed[f'batch{batch}']}", flush=True)
    results["decode"] = speed
    del plain, models
    # The same at batch 1 through the embedded engine, the serving path (fused fp32 projections and stacked
    # experts; INT4 modules called as they are).
    results["engine_decode_batch1"] = engine_decode(fp32, int4_g128, args.prompt, args.decode_tokens, args.rounds)
    print(f"  engine decode batch 1: {results['engine_decode_batch1']}", flush=True)
    del int4_g128
    results["gemv"] = [r for b in (1, 16) for r in gemv_bench(b)]
    results["targets"]["decode_b1_ge_1.8x_fp32"] = speed["batch1"]["int4_vs_fp32_best"] >= 1.8

    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({"accuracy": acc, "targets": results["targets"]}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
