"""`glm5 bench proof`: the whole pipeline as a list of steps, each skipped when its output is already in the run
folder, so a killed run resumes at the step it was in (and that step's own command resumes its own work).

    tasks      the repair family's train and held-out splits                    (in-process: RepairSuite)
    expert     the expert's sessions on train, recorded by `glm5 bench swe`     (expert endpoint in-process)
               (on expert_slips of the tasks it first fails an edit, then corrects it: SFT trains the correction)
    corpus     the base model's synthetic conversations                         (in-process)
    init       `glm5 model init`
    base-copy  `glm5 finetune sft --full --dense-attention --pack` on drills that quote made-up names: the base
               model's first phase from scratch, where it learns to copy from its prompt (copy_steps; 0: none)
    base-dense the same on the corpus and the family's copy drills, from base-copy: the base model's
               pretraining, every key visible
    base       `glm5 finetune dsa-warmup` of base-dense: its indexers learn its attention, then a sparse stage
    sft        `glm5 finetune sft --full` on the expert's resolved trajectories
    rl         `glm5 finetune rl --env swe` on the train split (async, GLM-5's rules), merged; every
               rl_curve_every steps its adapter is kept, and measure-rl-step-K benches it on held-out
               (`glm5 serve PREV --lora RUN/models/rl/adapters/step-K`): the learning curve through `glm5 bench`;
               an adapter with the last step's weights (no later step had signal) is not benched again: its
               point is RL's own measurement (RUN/bench/rl-step-K.same.json says so)
    forget     `glm5 finetune sft --full` on another task kind (renames only): what it makes the model lose
    distill    `glm5 finetune distill --full`: forget's model taught by the stage before forget (rl, or sft) on
               the contexts of every turn of the train split's expert sessions (RUN/corpus/distill.jsonl, written
               from RUN/expert first)
    rl-sync    RL again with --sync, from the same SFT checkpoint: only its learning curve is kept (last)
and after each model stage: measure-<stage> (`glm5 serve` INT4 + MTP, `glm5 bench swe -k K --seed SEED` on
held-out; rl served as the SFT checkpoint with RL's adapter, `served_as`) and
compare-<stage> (`glm5 bench compare` with the stage before). The table and plots are rebuilt at the end of
every run from whatever the folder holds. A failed step stops the steps after it (they need its output) and
is reported with its command and log; rerunning the same command retries it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.proof.commands import (
    agent_config,
    base_copy_cmd,
    base_dense_cmd,
    compare_cmd,
    distill_prompts,
    expert_cmd,
    init_cmd,
    model_dir,
    previous,
    rl_step_adapter,
    rl_sync_cmd,
    shown,
    stage_cmd,
    task_file,
)
from finetune.proof.config import ProofConfig, claim, rl_curve_steps
from finetune.proof.corpus import deployed_prompt, write_corpus, write_drills, write_turn_prompts
from finetune.proof.expert_server import ExpertServer
from finetune.proof.measure import StageFailed, child_env, run_logged, serve_and_bench
from finetune.proof.table import same_as_last, write_table
from plugins.bench_suites.repair_suite import RepairSuite

Event = Callable[[str, dict[str, Any]], None]


@dataclass
class Step:
    name: str
    what: str  # the command line, or what an in-process step does
    done: Callable[[], bool]
    run: Callable[[], None]


def _bench_complete(folder: Path) -> bool:
    try:
        return bool(json.loads((folder / "report.json").read_text())["complete"])
    except (OSError, ValueError, KeyError):
        return False


def _checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def build_steps(run: Path, c: ProofConfig, log: Callable[[str], None]) -> list[Step]:
    """Every step of the proof in order: what goes before the model (tasks, expert, corpus, init), then each
    stage with its measurement and comparison (and RL's curve points), then the synchronous RL baseline."""
    steps = [_tasks_step(run, c), _expert_step(run, c), _corpus_step(run, c), _init_step(run, c)]
    measured: list[str] = []
    for stage in c.stages:
        if stage == "base":
            steps += _base_pretrain_steps(run, c)
        steps += _stage_steps(run, stage, c, log, measured[-1] if measured else None)
        measured.append(stage)
        if stage == "rl":
            steps += _rl_curve_steps(run, c, log)
    if "rl" in c.stages and c.rl_sync_baseline:
        argv = rl_sync_cmd(run, c)
        steps.append(Step("rl-sync", shown(argv), lambda: _checkpoint(model_dir(run, "rl-sync")),
                          lambda: run_logged(argv, run / "logs" / "rl-sync.log", child_env(run), cwd=run)))  # fmt: skip
    return steps


def _tasks_step(run: Path, c: ProofConfig) -> Step:
    """The repair family's train, held-out and dev splits, materialized in RUN/tasks."""

    def tasks() -> None:
        for split, n in (("train", c.n_train), ("heldout", c.n_heldout), ("dev", c.n_dev)):
            RepairSuite(split, c.seed, n).materialize(run / "tasks" / split)

    def tasks_done() -> bool:
        return all(task_file(run, split).is_file() for split in ("train", "heldout", "dev"))

    return Step("tasks", f"repair family seed {c.seed}: {c.n_train} train, {c.n_heldout} held-out, "
                f"{c.n_dev} dev (RL's in-run evaluation)", tasks_done, tasks)  # fmt: skip


def _expert_step(run: Path, c: ProofConfig) -> Step:
    """The expert's sessions on train, recorded by `glm5 bench swe` against the in-process expert endpoint."""

    def expert() -> None:
        with ExpertServer(slip_rate=c.expert_slips) as server:
            run_logged(
                expert_cmd(run, c, server.base_url), run / "logs" / "expert.log", child_env(run), threads=True, cwd=run
            )

    slips = f" (the expert first fails an edit on {c.expert_slips:.0%} of the tasks)" if c.expert_slips else ""
    return Step("expert", shown(expert_cmd(run, c, "http://127.0.0.1:PORT/v1")) + slips,
                lambda: _bench_complete(run / "expert"), expert)  # fmt: skip


def _corpus_step(run: Path, c: ProofConfig) -> Step:
    """The base model's corpus, its copy drills and the forgetting stage's renames (chat.jsonl last: the mark)."""

    def corpus() -> None:
        system, tools = deployed_prompt(run / "expert")
        write_corpus(run / "corpus" / "forget.jsonl", c.forget_size, c.seed, system, tools, kinds=("rename",))
        write_drills(run / "corpus" / "drill.jsonl", c.drill_size, c.seed, c.drill_in_code, c.drill_fresh_names,
                     c.drill_nonsense, c.drill_numbers)  # fmt: skip
        if c.copy_steps:
            write_drills(run / "corpus" / "copy.jsonl", c.copy_size, c.seed, nonsense=1.0)
        write_corpus(run / "corpus" / "chat.jsonl", c.corpus_size, c.seed, system, tools)  # last: the done mark

    return Step("corpus", f"{c.corpus_size} synthetic sessions with the deployed prompt and tools "
                f"(+ {c.drill_size} copy drills"
                + (f", {c.drill_numbers:.0%} of them comparison lines" if c.drill_numbers else "")
                + f", {c.forget_size} renames for the forgetting stage)",
                lambda: (run / "corpus" / "chat.jsonl").is_file(), corpus)  # fmt: skip


def _init_step(run: Path, c: ProofConfig) -> Step:
    """`glm5 model init` into a partial folder, renamed when whole."""

    def init() -> None:
        tmp = model_dir(run, ".init.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        argv = init_cmd(run, c)
        argv[argv.index("--out") + 1] = str(tmp)
        run_logged(argv, run / "logs" / "init.log", child_env(run), cwd=run)
        tmp.replace(model_dir(run, "init"))

    return Step("init", shown(init_cmd(run, c)), lambda: _checkpoint(model_dir(run, "init")), init)


def _base_pretrain_steps(run: Path, c: ProofConfig) -> list[Step]:
    """Before the base stage: base-copy (copy drills from scratch, when copy_steps) and base-dense."""
    steps: list[Step] = []
    if c.copy_steps:
        copy = base_copy_cmd(run, c)
        steps.append(Step("base-copy", shown(copy), lambda: _checkpoint(model_dir(run, "base-copy")),
                          lambda a=copy: run_logged(a, run / "logs" / "base-copy.log", child_env(run),
                                                    cwd=run)))  # fmt: skip
    dense = base_dense_cmd(run, c)
    steps.append(Step("base-dense", shown(dense), lambda: _checkpoint(model_dir(run, "base-dense")),
                      lambda a=dense: run_logged(a, run / "logs" / "base-dense.log", child_env(run),
                                                 cwd=run)))  # fmt: skip
    return steps


def _stage_steps(run: Path, stage: str, c: ProofConfig, log: Callable[[str], None], prev: str | None) -> list[Step]:
    """A model stage, its measure-<stage> and, after the first measured stage, compare-<stage> with `prev`."""
    argv = stage_cmd(run, stage, c)
    log_file = run / "logs" / f"{stage}.log"

    def train(a: list[str] = argv, f: Path = log_file, s: str = stage) -> None:
        if s == "distill":
            write_turn_prompts(run / "expert", distill_prompts(run), thinking=c.thinking)
        run_logged(a, f, child_env(run), cwd=run)

    steps = [Step(stage, shown(argv), lambda s=stage: _checkpoint(model_dir(run, s)), train)]
    served, lora = served_as(run, stage, c)
    steps.append(Step(f"measure-{stage}", f"glm5 serve {served}{f' --lora {lora}' if lora else ''} + glm5 bench "
                      f"swe -k {c.k} held-out",
                      lambda s=stage: _bench_complete(run / "bench" / s)
                      and (run / "bench" / f"{s}.serve.json").is_file(),
                      lambda s=stage, m=served, a=lora: serve_and_bench(run, s, c, log, model=m, lora=a)))  # fmt: skip
    if prev is not None:

        def compare(a: str = prev, b: str = stage) -> None:
            p = subprocess.run(compare_cmd(run, a, b), capture_output=True, text=True, env=child_env(run), cwd=run)
            if p.returncode != 0:
                raise StageFailed(f"glm5 bench compare {a} {b} failed: {p.stderr.strip()[-500:]}")
            (run / "bench" / f"compare-{b}.json").write_text(p.stdout)

        steps.append(Step(f"compare-{stage}", shown(compare_cmd(run, prev, stage)),
                          lambda s=stage: (run / "bench" / f"compare-{s}.json").is_file(), compare))  # fmt: skip
    return steps


def _rl_curve_steps(run: Path, c: ProofConfig, log: Callable[[str], None]) -> list[Step]:
    """measure-rl-step-K for every point of RL's learning curve, served from the stage before RL."""
    steps: list[Step] = []
    start = model_dir(run, previous("rl", c.stages))
    for k in rl_curve_steps(c):
        name, adapter = f"rl-step-{k}", rl_step_adapter(run, k)
        steps.append(Step(f"measure-{name}", f"glm5 serve {start} --lora {adapter} + glm5 bench swe -k {c.k} "
                          "held-out (unless it holds the last step's weights: RL's own measurement)",
                          lambda n=name: _bench_complete(run / "bench" / n) or same_as_last(run, n).is_file(),
                          lambda k=k, m=start: measure_rl_step(run, k, c, log, m)))  # fmt: skip
    return steps


def served_as(run: Path, stage: str, c: ProofConfig) -> tuple[Path, Path | None]:
    """What measure-<stage> serves: the stage's checkpoint; for rl, the stage before it with RL's LoRA adapter,
    as each point of RL's curve is served. Merged and quantized to INT4 again, every weight of the base is rounded
    anew, and the rounding moved the deployed weights ~7x as far as RL's own change did (|LoRA delta| 0.7% of |W|,
    INT4's rounding 10%: benchmarks/RESULTS.md): the served difference from SFT was mostly rounding."""
    if stage == "rl":
        return model_dir(run, previous("rl", c.stages)), model_dir(run, "rl") / "adapter"
    return model_dir(run, stage), None


def measure_rl_step(run: Path, k: int, c: ProofConfig, log: Callable[[str], None], start: Path) -> None:
    """Bench RL's step-k adapter on held-out, unless its weights are the last step's (no step after k had a group
    with signal, so nothing changed): then RL's own measurement is that point, and benching it again would only
    spend minutes on a replicate; a mark says so."""
    adapter, last = rl_step_adapter(run, k), rl_step_adapter(run, c.rl_steps)
    weights = "adapter_model.safetensors"
    if (last / weights).is_file() and (adapter / weights).read_bytes() == (last / weights).read_bytes():
        mark = same_as_last(run, f"rl-step-{k}")
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(json.dumps({"step": k, "same_weights_as_step": c.rl_steps, "measured": "rl"}) + "\n")
        log(f"RL step {k}'s adapter holds step {c.rl_steps}'s weights: its held-out point is RL's measurement")
        return
    serve_and_bench(run, f"rl-step-{k}", c, log, model=start, lora=adapter)


def run_proof(run: Path, c: ProofConfig, *, force: bool = False, plan: bool = False,
              on_event: Event | None = None) -> dict[str, Any]:  # fmt: skip
    """Run (or resume) the proof in `run`; with plan=True only say what each step would do. The summary."""
    run = Path(run).resolve()
    emit = on_event or (lambda kind, data: None)

    def log(msg: str) -> None:
        emit("log", {"message": msg})

    steps = build_steps(run, c, log)
    if plan:
        return {"run": str(run), "plan": [{"step": s.name, "done": s.done(), "command": s.what} for s in steps]}
    claim(run, c, force)
    (run / "config").mkdir(exist_ok=True)
    (run / "config" / "config.toml").write_text(agent_config(c), encoding="utf-8")
    status_path = run / "proof-status.json"

    def write_status(statuses: list[dict[str, Any]], complete: bool, table: dict | None = None) -> dict[str, Any]:
        timed = [x["seconds"] for x in statuses if x.get("seconds") is not None]
        summary = {"run": str(run), "complete": complete, "steps": statuses,
                   "seconds": round(sum(timed), 1),  # every step's own time, earlier invocations' included
                   "untimed": [x["step"] for x in statuses if x["status"] != "not run" and x.get("seconds") is None]}  # fmt: skip
        if table is not None:
            summary["table"] = table
        status_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        return summary

    statuses = run_steps(steps, emit, earlier_seconds(status_path), lambda st: write_status(st, False))
    failed = next((x["step"] for x in statuses if x["status"] == "failed"), None)
    return write_status(statuses, failed is None, write_table(run, c.stages, c))


def earlier_seconds(status_path: Path) -> dict[str, float]:
    """The times of the steps an earlier invocation ran (RUN/proof-status.json, written after every step), so a
    resumed run still knows its end-to-end time. Unreadable: none."""
    try:
        steps = json.loads(status_path.read_text(encoding="utf-8"))["steps"]
        return {x["step"]: float(x["seconds"]) for x in steps if x.get("seconds") is not None}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def run_steps(
    steps: list[Step], emit: Event, earlier: dict[str, float] | None = None, record: Callable | None = None
) -> list[dict[str, Any]]:
    """Run the steps not done yet, in order; after a failure the rest are `not run`. One status per step; a step
    done before keeps the time `earlier` gives it. `record(statuses)` after every step (and before each runs)."""
    statuses: list[dict[str, Any]] = []
    earlier = earlier or {}
    failed = None
    for s in steps:
        if failed is not None:
            statuses.append({"step": s.name, "status": "not run", "reason": f"needs {failed}"})
            continue
        if s.done():
            statuses.append({"step": s.name, "status": "done before"})
            if s.name in earlier:
                statuses[-1]["seconds"] = earlier[s.name]
            emit("skip", {"step": s.name})
            continue
        if record is not None:
            record(statuses)
        emit("start", {"step": s.name, "command": s.what})
        t0 = time.monotonic()
        try:
            s.run()
            if not s.done():
                raise StageFailed(f"{s.name} finished but its output is not there")
        except (StageFailed, OSError, ValueError) as e:
            failed = s.name
            statuses.append({"step": s.name, "status": "failed", "reason": str(e)})
            emit("fail", {"step": s.name, "reason": str(e)})
            continue
        seconds = round(time.monotonic() - t0, 1)
        statuses.append({"step": s.name, "status": "done", "seconds": seconds})
        emit("done", {"step": s.name, "seconds": seconds})
        if record is not None:
            record(statuses)
    return statuses
