"""The recipe of agentic RL (`glm5 finetune rl --env swe|terminal|scripted`): everything it does once its options
are parsed (moved from glm5cli/rl_cmd.py's _agentic).

    job = AgenticJob(model, out, "swe", cfg=RLConfig(...), tasks_file=Path("tasks.jsonl"))
    rl = AgenticRun(job, reporter)       # the checkpoint's tokenizer
    result = rl.run()                    # the summary

The life of a run: the environment and its tasks (the bench's, or the scripted family) and the held-out tasks
-> the run folder (finetune/recipe.py) -> the model in fp32, rounded as INT4 serving rounds it with --quant int4,
LoRA added -> the rollout server: --rollout-url's routers, the run's own `glm5 serve` child (engine_process.py,
started here and stopped at the end, also on an error) or our engine on a thread -> run.run_rl, each log row
appended to rl_log.jsonl and every --save-every-th step's adapter written to OUT/adapters/step-K -> the adapter
(and --merge's checkpoint) -> the folder is renamed to OUT.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from finetune.artifacts import write_adapter, write_atomic, write_qlora_adapter, write_step_adapter
from finetune.distributed import Distributed
from finetune.errors import RunError, UsageError
from finetune.grpo import RL_TARGETS
from finetune.loading import check_qlora_merge, checkpoint_tokenizer, load_for_training, load_qlora
from finetune.lora import LoraSettings, add_lora, weights_fingerprint
from finetune.recipe import Reporter, Run
from finetune.rl.bench_env import BenchEnv, load_bench_tasks
from finetune.rl.config import RLConfig
from finetune.rl.engine_process import ServeChild
from finetune.rl.evaluate import HeldOut, disjoint
from finetune.rl.remote import HttpServer, Router
from finetune.rl.rewards import RewardSpecError, parse_reward_spec
from finetune.rl.run import run_rl, summary
from finetune.rl.scripted import ScriptedFamily, digit_tasks
from finetune.rl.sharded import ShardedTrainer
from finetune.rl.trainer import Trainer
from model.quant_int4 import round_like_int4

FOLLOW_TIMEOUT_S = 7 * 24 * 3600.0  # a step's sessions, or an evaluation, take what they take
# what a run leaves in its work folder that OUT does not keep
_SCRATCH = ("rollouts", "sessions", "pushes", "eval-sessions")


@dataclass(frozen=True)
class AgenticJob:
    """`glm5 finetune rl`'s options for an agentic run, parsed (see its --help for each)."""

    model: Path
    out: Path
    env: str
    cfg: RLConfig
    tasks_file: Path | None = None
    task_dirs: list[Path] = field(default_factory=list)
    reward: str | None = None
    rank: int = 16
    alpha: int = 32
    max_model_len: int = 16384
    urls: list[str] = field(default_factory=list)
    merge: bool = False
    save_every: int = 0
    eval_tasks: Path | None = None
    eval_samples: int = 2
    engine: str = "thread"  # thread, process or url
    engine_threads: int = 0
    quant: str | None = None
    api_key: str | None = None
    profile: str | None = None  # the agent profile of swe / terminal sessions (None: the config's, else full)
    qlora: bool = False  # LoRA over the base frozen as stored; under torchrun sharded (finetune/rl/sharded.py)


def environment(env: str, tasks_file: Path | None, task_dirs: list[Path], cfg: RLConfig, reward: str | None,
                profile: str | None = None):  # fmt: skip
    """-> (RolloutEnv, tasks, a description for the settings); bad input is a UsageError."""
    if env == "scripted":
        return ScriptedFamily(turns=min(cfg.max_turns, 3)), digit_tasks(8), {"family": "digit"}
    try:
        spec = parse_reward_spec(json.loads(reward)) if reward else None
    except json.JSONDecodeError as e:
        raise UsageError(f"--reward is not JSON: {e.msg}") from None
    except RewardSpecError as e:
        raise UsageError(f"--reward: {e}") from None
    if env == "swe" and tasks_file is None:
        raise UsageError("--env swe needs --tasks TASKS.jsonl (SWE-bench format)")
    if env == "terminal" and not task_dirs:
        raise UsageError("--env terminal needs task folders: glm5 finetune rl CKPT --out OUT --env terminal DIR...")
    try:
        tasks = load_bench_tasks(env, tasks_file, task_dirs)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    if not tasks:
        raise UsageError("no tasks to train on")
    bench = BenchEnv(env, max_turns=cfg.max_turns, partial_credit=cfg.partial_credit, reward=spec, profile=profile)
    where = str(tasks_file.resolve()) if tasks_file else [str(d.resolve()) for d in task_dirs]
    return bench, tasks, {"tasks": where, "reward": reward}


def check_qlora_job(job: AgenticJob, torchrun: bool) -> None:
    """What --qlora needs, and torchrun needs --qlora: usage errors before anything loads."""
    if torchrun and not job.qlora:
        raise UsageError("under torchrun, agentic RL shards the policy's frozen base: add --qlora")
    if not job.qlora:
        return
    if job.quant is not None:
        raise UsageError("--qlora trains over the base as stored: give an INT4 checkpoint (glm5 model quantize) "
                         "instead of --quant int4")  # fmt: skip
    if job.engine == "thread":
        raise UsageError("--qlora samples through a rollout server: --rollout-engine process (the default) or "
                         "--rollout-url")  # fmt: skip
    check_qlora_merge(job.model, job.merge)


def held_out_tasks(env: str, path: Path, tasks: list) -> list:
    """--eval-tasks -> the held-out tasks, checked disjoint from the training tasks (a UsageError otherwise)."""
    try:
        held = load_bench_tasks(env, path if env == "swe" else None, [path] if env == "terminal" else [])
        disjoint(tasks, held)
    except (ValueError, OSError) as e:
        raise UsageError(f"--eval-tasks {path}: {e}") from None
    if not held:
        raise UsageError(f"--eval-tasks {path}: no tasks")
    return held


def step_description(env: str, row: dict) -> str:
    """The progress line of one rl_log row: the reward, solved and held-out rates, dropped groups."""
    reward = row.get("drawn_reward_mean", row["reward_mean"])
    rate = row.get("drawn_solved_rate", row["solved_rate"])
    solved = "" if rate is None else f", solved {rate:.0%}"
    if row.get("eval_solved_rate") is not None:
        solved += f", held-out {row['eval_solved_rate']:.0%}"
    quiet = row.get("dropped_by_reason", {}).get("no_signal", 0)  # dynamic sampling's, not failures
    drop = f", dropped {row['groups_dropped'] - quiet}" if row["groups_dropped"] > quiet else ""
    drop += f", {quiet} without signal" if quiet else ""
    return f"RL ({env}), reward {reward:.3f}{solved}{drop}"


class AgenticRun:
    """One agentic RL run: the tokenizer at construction, `run()` for the rest -> the summary."""

    def __init__(self, job: AgenticJob, reporter: Reporter):
        self.job, self.rep = job, reporter
        self.dist = Distributed.from_env()  # under torchrun
        check_qlora_job(job, self.dist is not None)
        if self.dist is not None:  # the other ranks wait in a broadcast while rank 0's sessions run: hours at scale
            self.dist.init(timeout_s=FOLLOW_TIMEOUT_S)
        self.main = self.dist is None or self.dist.is_main
        self.tok = checkpoint_tokenizer(job.model)
        # MODEL's weights', recorded beside every adapter written ("-": a --qlora base is never whole to hash)
        self.fingerprint: list[str] = ["-"] if job.qlora else []
        self.sharded: ShardedTrainer | None = None

    def settings(self, described: dict) -> dict:
        job = self.job
        settings = {"model": str(job.model.resolve()), "env": job.env, **described, "config": dataclasses.asdict(job.cfg)}
        settings |= {"rank": job.rank, "alpha": job.alpha, "merge": job.merge, "max_model_len": job.max_model_len,
                     "rollout_url": job.urls}  # fmt: skip
        settings["rollout_engine"] = job.engine
        if job.quant is not None:  # absent otherwise: run folders from before the flag resume
            settings["quant"] = job.quant
        if job.profile is not None:  # likewise
            settings["agent_profile"] = job.profile
        if job.eval_tasks is not None:
            settings |= {"eval_tasks": str(job.eval_tasks.resolve()), "eval_samples": job.eval_samples}
        settings["save_every"] = job.save_every
        return settings

    def run(self) -> dict | None:
        """The run -> its summary (None on a torchrun rank other than 0, which follows rank 0's trainer)."""
        if not self.main:
            return self._follow()
        job, cfg = self.job, self.job.cfg
        rl_env, tasks, described = environment(job.env, job.tasks_file, job.task_dirs, cfg, job.reward, job.profile)
        held = held_out_tasks(job.env, job.eval_tasks, tasks) if job.eval_tasks is not None else None
        # settings added since earlier run folders were written, at the value that behaviour had: those folders resume
        run = Run(job.out, self.settings(described), added={"config.refusal_penalty": 0.0, "config.negative_weight": 1.0},
                  reporter=self.rep)  # fmt: skip
        server = Router([HttpServer(u, api_key=job.api_key) for u in job.urls]) if job.urls else None
        t0 = time.monotonic()
        net = self._policy()
        # The agentic run keeps its own state.pt in the work folder (finetune/rl/run.py), without Run's "step" (its
        # resume line failed on it: a killed run could not be rerun); the resume line is said in _train.
        run.open({"tasks": len(tasks)})  # its state.pt is read by finetune/rl/run.py (check_rl_state)
        if hasattr(rl_env, "isolate"):  # a session sees neither this run's folders nor any task file's gold
            rl_env.isolate([run.work, job.out], [*tasks, *(held or [])])
        evaluate = None
        if held is not None:
            evaluate = HeldOut(rl_env, held, job.eval_samples, self.tok, cfg, run.work / "eval-sessions",
                               job.max_model_len)  # fmt: skip
        hist = self._train(net, rl_env, tasks, evaluate, server, run.work)
        # rl_log.jsonl is rewritten from the state's history: the rows of killed runs' last steps appear once.
        write_atomic(run.work / "rl_log.jsonl", "".join(json.dumps(h) + "\n" for h in hist))
        if job.qlora:
            write_qlora_adapter(job.model, net, run.work, job.merge, self.dist, self.rep.status)
            if self.dist is not None:
                self.dist.close()
        else:
            write_adapter(job.model, net, run.work, job.merge, self.fingerprint[0] if self.fingerprint else None,
                          job.quant, status=self.rep.status)  # fmt: skip
        for name in _SCRATCH:
            shutil.rmtree(run.work / name, ignore_errors=True)
        result = self._result(hist, len(tasks), run.work, held is not None, t0)
        run.finish()
        return result

    def _follow(self) -> None:
        """A torchrun rank other than 0: its shards of the policy, rank 0's commands until the run ends (every train
        step, state and push: finetune/rl/sharded.py), then its part of writing the adapter."""
        net = self._policy()
        self.sharded.follow()
        write_qlora_adapter(self.job.model, net, self.job.out, False, self.dist)
        self.dist.close()
        return None

    def _policy(self):
        """MODEL in fp32 (with --quant int4, its frozen weights rounded as INT4 serving rounds them) with LoRA;
        with --qlora its base frozen as stored, under torchrun this rank's shards (and `self.sharded` its
        trainer)."""
        job = self.job
        if job.qlora:
            settings = LoraSettings(rank=job.rank, alpha=job.alpha, targets=RL_TARGETS)
            net, _ = load_qlora(job.model, settings, self.dist, job.cfg.seed, self.rep.status)
            if self.dist is not None:
                self.sharded = ShardedTrainer(Trainer(net, job.cfg, dist=self.dist), self.dist)
            return net
        net = load_for_training(job.model, "train the full-precision checkpoint, then quantize the result",
                                self.rep.status)  # fmt: skip
        if job.quant == "int4":
            self.fingerprint.append(weights_fingerprint(net))  # before rounding: the adapter's base is MODEL as saved
            rounded = round_like_int4(net)
            self.rep.say(f"--quant int4: {len(rounded)} linears rounded as INT4 serving rounds them")
        return add_lora(net, LoraSettings(rank=job.rank, alpha=job.alpha, targets=RL_TARGETS), seed=job.cfg.seed)

    def _save_step_adapter(self, net, work: Path, k: int) -> None:
        """OUT/adapters/step-K, written aside and renamed: a kill never leaves half an adapter there."""
        if not self.fingerprint:
            self.fingerprint.append(weights_fingerprint(net))  # the base weights: the same at every step
        state = self.sharded.adapter_state() if self.sharded is not None else None
        write_step_adapter(net, work / "adapters" / f"step-{k}", self.job.model, self.fingerprint[0], self.job.quant,
                           state)  # fmt: skip

    def _train(self, net, rl_env, tasks: list, evaluate, server, work: Path) -> list[dict]:
        """run_rl on `server` (None: the run's own engine, a child process or a thread), each row into
        rl_log.jsonl -> the log rows."""
        job, cfg = self.job, self.job.cfg
        log_path = work / "rl_log.jsonl"
        done = len(log_path.read_text().splitlines()) if log_path.is_file() else 0
        if done:
            self.rep.say(f"resuming {work} from step {done} of {cfg.steps}")
        with self.rep.steps() as bar:
            task = bar.add_task(f"RL ({job.env})", total=cfg.steps, completed=done)

            def log(row: dict) -> None:
                if row["step"] > done:  # (a kill between a row's line and the state's note of it: the line is there)
                    with open(log_path, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    bar.update(task, advance=1, description=step_description(job.env, row))
                if job.save_every and (row["step"] % job.save_every == 0 or row["step"] == cfg.steps):
                    self._save_step_adapter(net, work, row["step"])

            child = None
            try:
                if job.engine == "process":
                    self.rep.say("starting the rollout engine: a glm5 serve child (its log: engine.log)")
                    child = ServeChild(job.model, work / "engine.log", job.max_model_len, cfg.concurrency,
                                       job.engine_threads, quant=job.quant)  # fmt: skip
                    child.split_threads()
                    server = child.server
                return run_rl(net, self.tok, rl_env, tasks, cfg, work, server=server, max_model_len=job.max_model_len,
                              log=log, evaluate=evaluate, eval_every=job.save_every, trainer=self.sharded)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - the run folder is kept; rerunning resumes
                raise RunError(f"the RL run stopped: {type(e).__name__}: {e}",
                               f"fix it and rerun the same command ({work} resumes)") from e  # fmt: skip
            finally:
                if child is not None:
                    child.close()  # also on Ctrl-C; a kill -9 of this process kills it too (PR_SET_PDEATHSIG)

    def _result(self, hist: list[dict], n_tasks: int, work: Path, held: bool, t0: float) -> dict:
        job = self.job
        out = job.out
        result = {"out": str(out), "adapter": str(out / "adapter"), "merged_checkpoint": str(out) if job.merge else None}
        result |= {"env": job.env, "tasks": n_tasks, **summary(hist), "seconds": round(time.monotonic() - t0, 1)}
        if job.save_every:
            result["step_adapters"] = sorted(str(out / "adapters" / p.name) for p in (work / "adapters").glob("step-*"))
        if held:
            before = hist[0].get("eval_before") if hist else None
            curve = [{"step": 0, "solved_rate": before["eval_solved_rate"]}] if before else []
            curve += [{"step": h["step"], "solved_rate": h["eval_solved_rate"]} for h in hist if "eval_solved_rate" in h]
            result["held_out_solved_rate"] = curve
        return result
