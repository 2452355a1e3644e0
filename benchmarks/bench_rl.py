"""Agentic RL throughput and learning (finetune/rl): asynchronous against synchronous on the same tasks, and a
learning curve on a task family `tiny` can learn.

    .venv/bin/python benchmarks/bench_rl.py [--steps 6] [--rounds 2] [--engine thread|process|both]
                                            [--workload uniform|long-tail|agentic|all] [--curve-steps 20]
                                            [--out bench_rl.json]

1. Throughput: the scripted digit family with up to 3 turns per session (tool feedback between them; `--workload
   long-tail`: each session runs a fixed 1, 2, 4 or 12 turns, 50/25/15/10%, the spread of agentic sessions'
   lengths that asynchronous RL exists to absorb; `agentic`: long-tail, and each tool result takes 0.3 s, a
   sandboxed test run on another machine) and a grader that runs in a real subprocess per session (a test suite's
   latency), `--steps` optimizer steps of 2 groups x 8 sessions, up to `--concurrency` sessions at once (16, one
   step's: a synchronous run never has more in flight), with `--sync` and asynchronous (tau = 2): same seeds,
   tasks, flags and code,
   `sync` the only difference, interleaved for `--rounds` rounds (sync, async, sync, async, ...). An untimed
   one-step run goes first, so first-use costs fall on neither side. Reported per run: wall time, sessions
   trained and sessions run (started), rollouts per second, the trainer's idle time (waiting for groups), the
   rollout engine's idle time, the CPU seconds of the process and of its graders, rollouts per CPU second (the
   figure a shared machine's load disturbs least), and `uptime`'s load; then async / sync per round.
   `--engine process`: each run samples from its own `glm5 serve` child (finetune/rl/engine_process.py; half the
   cores each, its start reported apart and not timed, its CPU counted); `both`: each round runs the pair on the
   thread engine, then on the process engine, and reports process / thread too.
2. Learning: the synchronous run for `--curve-steps` steps on 4 training tasks; before it and every few steps
   the pushed policy's solved rate on 4 held-out tasks of the family (other prompts; 16 sampled sessions each,
   the run's own sampling) is measured by the run's held-out evaluation (finetune/rl/evaluate.py).
Numbers are for this machine (CPU, shared); the JSON says which.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from finetune.grpo import RL_TARGETS  # noqa: E402
from finetune.rl.config import RLConfig  # noqa: E402
from finetune.rl.engine_process import ServeChild  # noqa: E402
from finetune.rl.evaluate import HeldOut  # noqa: E402
from finetune.rl.run import run_rl, summary  # noqa: E402
from finetune.rl.scripted import ScriptedFamily, ScriptedTask, digit_tasks, long_tail_lengths  # noqa: E402
from finetune.sft import LoraSettings, add_lora  # noqa: E402
from model import GLM5ForCausalLM  # noqa: E402
from model.config import preset  # noqa: E402
from model.tokenizer import Tokenizer  # noqa: E402

GRADER = [sys.executable, "-c", "import sys, re; sys.exit(0 if re.search('[0-9]', sys.stdin.read()) else 1)"]
HELD_OUT = [ScriptedTask(f"held-{i}", p) for i, p in enumerate(["say a year", "how many days in a week",
            "what is ten minus two", "give a page number"])]  # fmt: skip


# the agentic workload's wait per tool result: a sandboxed test run elsewhere (the repair family's pytest in a
# sandbox takes ~0.3-1 s); the session waits, the engine and the trainer do not
TOOL_S = 0.3


def peaky_model():
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return add_lora(model, LoraSettings(rank=8, alpha=16, targets=RL_TARGETS), seed=0)


class CountingFamily(ScriptedFamily):
    """The scripted family, counting the sessions it starts (trained or not)."""

    def reset(self, task, workdir, sample=0):
        self.started = getattr(self, "started", 0) + 1
        return super().reset(task, workdir, sample)


def child_cpu_s(pid: int) -> float:
    """utime + stime of a live process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(who) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def load() -> float:
    return round(os.getloadavg()[0], 2)


def peaky_checkpoint(d: Path) -> Path:
    """peaky_model's base weights as a checkpoint the rollout engine's `glm5 serve` child loads."""
    from model.tokenizer import save_tokenizer_files

    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(d)
    save_tokenizer_files(d)
    return d


def throughput(tok, steps: int, sync: bool, engine: str = "thread", ckpt: Path | None = None,
               workload: str = "uniform", concurrency: int = 16) -> dict:  # fmt: skip
    tail = workload in ("long-tail", "agentic")
    cfg = RLConfig(steps=steps, groups_per_step=2, group_size=8, max_new_tokens=16, max_turns=12 if tail else 3,
                   lr=5e-3, sync=sync, max_staleness=2, concurrency=concurrency)  # fmt: skip
    fam = CountingFamily(turns=3, grade_cmd=GRADER, lengths=long_tail_lengths if tail else None,
                         tool_s=TOOL_S if workload == "agentic" else 0.0)  # fmt: skip
    max_len = 1024 if tail else 512
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        server, start_s, child_cpu0 = None, 0.0, 0.0
        if engine == "process":
            # The child's start (model load, warm-up; a run pays it once) is reported apart, not timed: the
            # comparison is of the run's steady state. Its CPU from here on counts.
            t = time.monotonic()
            child = stack.enter_context(ServeChild(ckpt, Path(d) / "engine.log", max_len, cfg.concurrency, threads=0))
            child.split_threads()
            server, start_s, child_cpu0 = child.server, time.monotonic() - t, child_cpu_s(child.pid)
        load0, cpu0, kids0 = load(), cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        hist = run_rl(peaky_model(), tok, fam, digit_tasks(8), cfg, Path(d), server=server, max_model_len=max_len)
        wall = time.monotonic() - t0
        engine_cpu = child_cpu_s(child.pid) - child_cpu0 if server is not None else 0.0
        load1 = load()
    # close() reaped the child: RUSAGE_CHILDREN now holds all of its CPU; its start's is taken out
    cpu = cpu_s(resource.RUSAGE_SELF) - cpu0
    kids = cpu_s(resource.RUSAGE_CHILDREN) - kids0 - child_cpu0
    sessions = sum(h["sessions"] for h in hist)
    return {
        "mode": ("sync" if sync else "async (tau 2)") + f", {engine} engine, {workload} sessions",
        "concurrency": concurrency,
        "engine_start_s": round(start_s, 2),
        "engine_cpu_s": round(engine_cpu, 2),
        "wall_s": round(wall, 2),
        "sessions_trained": sessions,
        "sessions_run": fam.started,
        "rollouts_per_s": round(sessions / wall, 3),
        "cpu_s": round(cpu, 2),
        "children_cpu_s": round(kids, 2),  # graders, and the engine child with --engine process
        "rollouts_per_cpu_s": round(sessions / (cpu + kids), 3),
        "load_1min": [load0, load1],
        "trainer_idle_s": round(sum(h["trainer_idle_s"] for h in hist), 2),
        "trainer_idle_fraction": round(sum(h["trainer_idle_s"] for h in hist) / wall, 3),
        "server_idle_s": round(sum(h["server_idle_s"] for h in hist), 2),
        "train_s": round(sum(h["train_s"] for h in hist), 2),
        "staleness_hist": {k: sum(h["staleness_hist"].get(k, 0) for h in hist) for k in ("0", "1", "2")},
        "reward_mean": round(sum(h["reward_mean"] for h in hist) / len(hist), 4),
    }


def learning_curve(tok, steps: int, every: int) -> dict:
    model = peaky_model()
    cfg = RLConfig(steps=steps, groups_per_step=2, group_size=8, max_new_tokens=5, lr=5e-3, sync=True, concurrency=16)
    with tempfile.TemporaryDirectory() as d:
        held = HeldOut(ScriptedFamily(), HELD_OUT, 16, tok, cfg, Path(d) / "eval", max_model_len=256)
        hist = run_rl(model, tok, ScriptedFamily(), digit_tasks(4), cfg, Path(d) / "run", max_model_len=256,
                      evaluate=held, eval_every=every)  # fmt: skip
    points = [(0, hist[0]["eval_before"]["eval_solved_rate"])]
    points += [(h["step"], h["eval_solved_rate"]) for h in hist if "eval_solved_rate" in h]
    return {
        "train_reward_by_step": [round(h["reward_mean"], 4) for h in hist],
        "held_out_solved_rate": [{"step": s, "solved_rate": round(v, 4)} for s, v in points],
        "summary": summary(hist),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2, help="sync/async pairs, interleaved")
    ap.add_argument("--no-curve", action="store_true", help="throughput only")
    ap.add_argument("--curve-steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--engine",
        choices=("thread", "process", "both"),
        default="thread",
        help="thread: the in-process engine; process: a glm5 serve child per run (half the cores each); both: "
        "each round runs sync and async on the thread engine, then on the process engine",
    )
    ap.add_argument(
        "--workload",
        choices=("uniform", "long-tail", "agentic", "all"),
        default="all",
        help="uniform: every session up to 3 turns, ending at its first digit; long-tail: each session runs a fixed "
        "1, 2, 4 or 12 turns (50/25/15/10%%), as agentic sessions' lengths spread; agentic: long-tail, and each "
        f"tool result takes {TOOL_S} s (a sandboxed test run elsewhere); all: each round runs the three",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="sessions in flight at most, the same flag for both runs (a step is 16 sessions): a synchronous run "
        "never has more than one step's in flight, an asynchronous one up to this many, staleness allowing",
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("bench_rl.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = Tokenizer.shipped()
    ckpt_dir = tempfile.TemporaryDirectory()
    engines = ("thread", "process") if args.engine == "both" else (args.engine,)
    ckpt = peaky_checkpoint(Path(ckpt_dir.name)) if "process" in engines else None
    workloads = ("uniform", "long-tail", "agentic") if args.workload == "all" else (args.workload,)
    for engine in engines:  # untimed: first-use costs (kernel probes, allocator) fall on no side
        throughput(tok, 1, sync=False, engine=engine, ckpt=ckpt, concurrency=args.concurrency)
    tails = [(e, w, "".join(f"_{x}" for x, n in ((e, len(engines)), (w, len(workloads))) if n > 1))
             for w in workloads for e in engines]  # fmt: skip
    rounds = []
    for _ in range(args.rounds):
        pair = {}
        for engine, workload, tail in tails:
            for sync in (True, False):
                torch.set_num_threads(args.threads)  # a process-engine run split them; each run starts the same
                key = ("sync" if sync else "async") + tail
                pair[key] = throughput(tok, args.steps, sync=sync, engine=engine, ckpt=ckpt, workload=workload,
                                       concurrency=args.concurrency)  # fmt: skip
                print(json.dumps(pair[key]), flush=True)
        for _e, _w, tail in tails:
            for key in ("rollouts_per_s", "rollouts_per_cpu_s"):
                pair[f"async_over_sync_{key}{tail}"] = round(pair[f"async{tail}"][key] / pair[f"sync{tail}"][key], 3)
        if len(engines) == 2:
            for workload in workloads:
                w = "" if len(workloads) == 1 else f"_{workload}"
                for mode in ("sync", "async"):
                    ratio = pair[f"{mode}_process{w}"]["rollouts_per_s"] / pair[f"{mode}_thread{w}"]["rollouts_per_s"]
                    pair[f"process_over_thread_rollouts_per_s_{mode}{w}"] = round(ratio, 3)
        rounds.append(pair)
    curve = None if args.no_curve else learning_curve(tok, args.curve_steps, args.every)
    if curve is not None:
        print(json.dumps(curve["held_out_solved_rate"]), flush=True)
    result = {
        "benchmark": "bench_rl",
        "command": "python benchmarks/bench_rl.py " + " ".join(sys.argv[1:]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": args.threads, "engine": args.engine, "workload": args.workload,
                    "concurrency": args.concurrency,
                    "note": "CPU shared with other jobs"},  # fmt: skip
        "throughput": rounds,
        "learning": curve,
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    ratios = "; ".join(
        ", ".join(f"{e} {w}: {r[f'async_over_sync_rollouts_per_s{t}']}x "
                  f"({r[f'async_over_sync_rollouts_per_cpu_s{t}']}x per CPU s)" for e, w, t in tails)
        for r in rounds
    )  # fmt: skip
    msg = f"async / sync rollouts per second by round: {ratios}"
    if curve is not None:
        msg += (f"; held-out solved rate {curve['held_out_solved_rate'][0]['solved_rate']} -> "
                f"{curve['held_out_solved_rate'][-1]['solved_rate']}")  # fmt: skip
    print(f"{msg}; wrote {args.out}")


if __name__ == "__main__":
    main()
