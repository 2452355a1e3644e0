"""Agentic RL throughput and learning (finetune/rl): asynchronous against synchronous on the same tasks, and a
learning curve on a task family `tiny` can learn.

    .venv/bin/python benchmarks/bench_rl.py [--steps 6] [--curve-steps 20] [--out benchmarks/bench_rl.json]

1. Throughput: the scripted digit family with 3 turns per session (tool feedback between them) and a grader that
   runs in a real subprocess per session (a test suite's latency), `--steps` optimizer steps of 2 groups x 8
   sessions, 16 sessions at once, once with `--sync` and once asynchronous (tau = 2), same seeds and tasks.
   An untimed one-step run goes first, so first-use costs fall on neither side. Reported: wall time, sessions
   (rollouts) per second, the trainer's idle time (waiting for groups), the rollout
   engine's idle time, and async / sync.
2. Learning: the synchronous run for `--curve-steps` steps on 4 training tasks; every few steps the policy's
   solved rate on 4 held-out tasks of the family (other prompts; 16 sampled sessions each, the run's own
   sampling) is measured with the same orchestrator on a fresh engine serving a copy of the policy.
Numbers are for this machine (CPU, shared); the JSON says which.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from finetune.grpo import RL_TARGETS  # noqa: E402
from finetune.rl.config import RLConfig  # noqa: E402
from finetune.rl.orchestrator import Orchestrator  # noqa: E402
from finetune.rl.run import run_rl, summary  # noqa: E402
from finetune.rl.scripted import ScriptedFamily, ScriptedTask, digit_tasks  # noqa: E402
from finetune.rl.server import InProcessServer  # noqa: E402
from finetune.sft import LoraSettings, add_lora  # noqa: E402
from model import GLM5ForCausalLM  # noqa: E402
from model.config import preset  # noqa: E402
from model.tokenizer import Tokenizer  # noqa: E402

GRADER = [sys.executable, "-c", "import sys, re; sys.exit(0 if re.search('[0-9]', sys.stdin.read()) else 1)"]
HELD_OUT = [ScriptedTask(f"held-{i}", p) for i, p in enumerate(["say a year", "how many days in a week",
            "what is ten minus two", "give a page number"])]  # fmt: skip


def peaky_model():
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return add_lora(model, LoraSettings(rank=8, alpha=16, targets=RL_TARGETS), seed=0)


def throughput(tok, steps: int, sync: bool) -> dict:
    cfg = RLConfig(steps=steps, groups_per_step=2, group_size=8, max_new_tokens=16, max_turns=3, lr=5e-3,
                   sync=sync, max_staleness=2, concurrency=16)  # fmt: skip
    fam = ScriptedFamily(turns=3, grade_cmd=GRADER)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        hist = run_rl(peaky_model(), tok, fam, digit_tasks(8), cfg, Path(d), max_model_len=512)
    wall = time.monotonic() - t0
    sessions = sum(h["sessions"] for h in hist)
    return {
        "mode": "sync" if sync else "async (tau 2)",
        "wall_s": round(wall, 2),
        "sessions_trained": sessions,
        "rollouts_per_s": round(sessions / wall, 3),
        "trainer_idle_s": round(sum(h["trainer_idle_s"] for h in hist), 2),
        "trainer_idle_fraction": round(sum(h["trainer_idle_s"] for h in hist) / wall, 3),
        "server_idle_s": round(sum(h["server_idle_s"] for h in hist), 2),
        "train_s": round(sum(h["train_s"] for h in hist), 2),
        "staleness_hist": {k: sum(h["staleness_hist"].get(k, 0) for h in hist) for k in ("0", "1", "2")},
        "reward_mean": round(sum(h["reward_mean"] for h in hist) / len(hist), 4),
    }


def solved_rate(model, tok, cfg: RLConfig, n: int = 16) -> float:
    server = InProcessServer(copy.deepcopy(model), tok, 256, 16, seed=123)
    got = []
    with tempfile.TemporaryDirectory() as d:
        eval_cfg = RLConfig(group_size=n, max_new_tokens=cfg.max_new_tokens, concurrency=16, seed=123)
        orch = Orchestrator(ScriptedFamily(), HELD_OUT, server, tok, eval_cfg, Path(d), got.append, max_model_len=256)
        try:
            orch.run_groups(orch.next_ids(len(HELD_OUT)))  # the first epoch of the order covers every task once
        finally:
            orch.close()
            server.close()
    return sum(1 for r in got if r.solved) / len(got)


def learning_curve(tok, steps: int, every: int) -> dict:
    model = peaky_model()
    cfg = RLConfig(steps=steps, groups_per_step=2, group_size=8, max_new_tokens=5, lr=5e-3, sync=True, concurrency=16)
    points = [(0, solved_rate(model, tok, cfg))]

    def log(row):
        if row["step"] % every == 0:
            points.append((row["step"], solved_rate(model, tok, cfg)))

    with tempfile.TemporaryDirectory() as d:
        hist = run_rl(model, tok, ScriptedFamily(), digit_tasks(4), cfg, Path(d), max_model_len=256, log=log)
    return {
        "train_reward_by_step": [round(h["reward_mean"], 4) for h in hist],
        "held_out_solved_rate": [{"step": s, "solved_rate": round(v, 4)} for s, v in points],
        "summary": summary(hist),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--curve-steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("bench_rl.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = Tokenizer.shipped()
    throughput(tok, 1, sync=False)  # untimed: first-use costs (kernel probes, allocator) fall on neither side
    sync = throughput(tok, args.steps, sync=True)
    print(json.dumps(sync), flush=True)
    asyn = throughput(tok, args.steps, sync=False)
    print(json.dumps(asyn), flush=True)
    curve = learning_curve(tok, args.curve_steps, args.every)
    print(json.dumps(curve["held_out_solved_rate"]), flush=True)
    result = {
        "benchmark": "bench_rl",
        "command": "python benchmarks/bench_rl.py " + " ".join(sys.argv[1:]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": args.threads, "note": "CPU shared with other jobs"},  # fmt: skip
        "throughput": {"sync": sync, "async": asyn,
                       "async_over_sync_rollouts_per_s": round(asyn["rollouts_per_s"] / sync["rollouts_per_s"], 3)},
        "learning": curve,
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"async / sync rollouts per second: {result['throughput']['async_over_sync_rollouts_per_s']}x; "
          f"held-out solved rate {curve['held_out_solved_rate'][0]['solved_rate']} -> "
          f"{curve['held_out_solved_rate'][-1]['solved_rate']}; wrote {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
