"""`glm5 finetune rl`: RL on single completions (`--env completion`, GRPO + IcePop on a tasks file with checkable
rewards) or on whole agent sessions (`--env swe` / `terminal`: the bench's tasks, sandboxes and grading, with
`glm5 code`'s agent loop; `--env scripted`: a built-in toy family to check a setup). Parses and shows; the run
is finetune/grpo_run.py (completion) and finetune/rl/job.py (agentic), both on the one RL of finetune/rl."""

from __future__ import annotations

from pathlib import Path

import typer

from agent.profiles import PROFILES
from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json
from glm5cli.plan_cmd import preflight
from glm5cli.recipe_ui import ConsoleReporter, failing
from glm5cli.slime_cmd import write_slime_run

ENVS = ("completion", "swe", "terminal", "scripted")


def rl(
    model: Path = typer.Argument(..., help="Checkpoint directory (full precision)."),
    task_dirs: list[Path] = typer.Argument(None, help="--env terminal: Harbor task folders.", show_default=False),
    out: Path = typer.Option(
        ..., "--out", help="New directory: the adapter in OUT/adapter, per-step stats in OUT/rl_log.jsonl."
    ),
    env: str = typer.Option(
        "completion",
        "--env",
        metavar="<completion|swe|terminal|scripted>",
        help="completion: one completion per task, scored by its reward (--tasks, a prompts file). swe: agent "
        "sessions on SWE-bench-format tasks (--tasks TASKS.jsonl), graded by the bench. terminal: agent sessions "
        "on Harbor task folders (TASK_DIR...). scripted: a built-in toy family (answers must hold a digit).",
    ),
    tasks_file: Path | None = typer.Option(
        None,
        "--tasks",
        help='completion: JSONL, one task per line: {"prompt": text} or {"messages": [...]}, and "reward": '
        '{"type": "regex", "pattern": ...} or {"type": "command", "run": "pytest -q", "timeout": 60} '
        "(or a type a plugin registers). swe: the SWE-bench JSONL / JSON / parquet the bench reads.",
    ),
    reward: str | None = typer.Option(
        None,
        "--reward",
        help='completion: JSON reward spec for the tasks that have none, e.g. \'{"type": "command", "run": '
        "\"make check\"}'. Agentic: a hybrid reward spec (see finetune/rl/rewards.py) combining the bench's "
        "tests with an outcome reward model and a judge, with weights.",
    ),
    steps: int = typer.Option(100, min=1, help="Optimizer steps (one batch of groups each)."),
    prompts_per_step: int = typer.Option(4, "--prompts-per-step", "--groups-per-step", min=1, help="Tasks per step."),
    group_size: int = typer.Option(8, min=2, help="Completions or sessions per task (GRPO's group)."),
    max_new_tokens: int = typer.Option(256, min=1, help="Longest completion (agentic: per model call)."),
    max_turns: int = typer.Option(30, min=1, help="Agentic: model calls per session."),
    max_model_len: int = typer.Option(16384, min=64, help="Agentic: the rollout engine's context (prompt + reply)."),
    temperature: float = typer.Option(1.0, min=0.01, help="Sampling temperature of the rollouts."),
    lr: float = typer.Option(2e-5, help="Learning rate (AdamW)."),
    rank: int = typer.Option(16, min=1, help="LoRA rank."),
    alpha: int = typer.Option(32, min=1, help="LoRA alpha (the update is scaled by alpha / rank)."),
    updates_per_batch: int = typer.Option(
        1, min=1, help="completion: optimizer steps per rollout batch (PPO clip applies)."
    ),
    max_staleness: int = typer.Option(
        2, min=0, help="Agentic: drop a session whose oldest model call lags the trainer by more than N versions."
    ),
    is_low: float = typer.Option(0.2, help="Agentic: keep tokens with pi/pi_rollout >= 1 - IS_LOW (GLM-5: 0.2)."),
    is_high: float = typer.Option(0.28, help="Agentic: keep tokens with pi/pi_rollout <= 1 + IS_HIGH (GLM-5: 0.28)."),
    objective: str = typer.Option(
        "auto",
        metavar="<auto|double-is|icepop>",
        help="Agentic: double-is (GLM-5's off-policy rule), icepop ([1/2, 2]), auto (icepop with --sync)."
    ),
    reset_optimizer: bool = typer.Option(False, help="Agentic: reset AdamW at each weight push (GLM-5 does)."),
    sync: bool = typer.Option(False, "--sync", help="Agentic: the synchronous baseline (roll out, then train)."),
    concurrency: int = typer.Option(8, min=1, help="Agentic: sessions run at once."),
    rollout_url: list[str] = typer.Option(
        [],
        "--rollout-url",
        help="Agentic: a rollout server (`glm5 serve` or sglang: /generate + /load_lora_adapter) instead of the "
        "in-process engine; repeat for several (each session sticks to one, by consistent hashing).",
    ),
    rollout_api_key: str | None = typer.Option(
        None,
        "--rollout-api-key",
        envvar=["GLM5_ROLLOUT_API_KEY", "GLM5_API_KEY"],
        help="Agentic: the bearer token of the --rollout-url servers (their --api-key; env GLM5_ROLLOUT_API_KEY, "
        "else GLM5_API_KEY). Not written to the run folder.",
    ),
    rollout_engine: str | None = typer.Option(
        None,
        "--rollout-engine",
        metavar="<thread|process>",
        help="Agentic: process (the run starts a local `glm5 serve` child on 127.0.0.1, pushes each step's "
        "adapter to it and stops it at the end: sampling and training do not share one Python interpreter's "
        "lock; 1.15-1.41x the rollouts/s of thread on 2 shared cores, benchmarks/RESULTS.md; costs a second "
        "copy of the weights and ~10-25 s to start) or thread (our engine on a thread of this process). "
        "Default: process, none with --rollout-url.",
    ),
    engine_threads: int = typer.Option(
        0,
        min=0,
        help="Agentic, --rollout-engine process: torch threads of the child (0: half the cores; the "
        "trainer keeps the rest).",
    ),
    agent_profile: str = typer.Option(
        None,
        "--agent-profile",
        metavar="full|compact",
        help="swe / terminal (and --trainer slime): the agent profile every session runs, as `glm5 code --profile` "
        "(full: every tool and the full prompt; compact: read, edit, bash, glob and a short prompt). Default: the "
        "config's, else full.",
    ),
    keep_reasoning: bool = typer.Option(
        False, help="Agentic: never re-render old turns (the model sees its old reasoning) instead of branching."
    ),
    thinking: bool = typer.Option(
        True,
        help="Agentic: open each turn with `<think>` (GLM-5's default). --no-thinking renders `</think>` instead, as "
        "`chat_template_kwargs.enable_thinking=false` does in `glm5 serve`: for a model trained without reasoning.",
    ),
    partial_credit: bool = typer.Option(False, help="swe: reward the fraction of FAIL_TO_PASS tests that pass."),
    dynamic_sampling: int = typer.Option(
        0,
        min=0,
        help="Agentic: DAPO's dynamic sampling. A group whose sessions all got the same reward has no GRPO signal: "
        "drop it (rl_log.jsonl: dropped_by_reason no_signal) and run another task in its place, up to K x "
        "--groups-per-step such groups a step (past that the step trains on what it has); 0: off.",
    ),
    loss_agg: str = typer.Option(
        "sample",
        "--loss-agg",
        metavar="<sample|token>",
        help="Agentic: how a step's token terms are averaged. sample: each sample's mean, then 1/G over sessions "
        "(GRPO; a long sample's tokens weigh less each). token: one mean over every sampled token of the step "
        "(DAPO's token-level loss, TRL's default).",
    ),
    refusal_penalty: float = typer.Option(
        0.0,
        min=0.0,
        help="Agentic: a turn-level penalty P. The tokens of a model call whose tool call a tool refused (the agent "
        "loop answered `error: ...`: an edit whose old_string is not in the file, a missing path, bad arguments; "
        "not a command's nonzero exit) are trained with advantage min(A, 0) - P instead of the session's A: the step "
        "pushes down the calls that wasted a turn, even in a session that solved its task. 0: off (the outcome "
        "alone).",
    ),
    negative_weight: float = typer.Option(
        1.0,
        min=0.0,
        max=1.0,
        help="Agentic: the weight of sessions that did worse than their group (negative advantages). 1: GRPO; "
        "0: only the successes are reinforced (rejection-sampling fine-tuning on the policy's own sessions, "
        "which trades pass@k for pass@1).",
    ),
    quant: str | None = typer.Option(
        None,
        "--quant",
        metavar="<int4>",
        help="Agentic: int4 trains the adapter for the INT4 deployment, `glm5 serve MODEL --quant int4 --lora "
        "OUT/adapter`, which serves it beside the int4 weights. The trainer's frozen weights are rounded as that "
        "INT4 rounds them, and the rollout engine (process) serves --quant int4 with each pushed adapter: the "
        "policy sampled, trained, evaluated (--eval-tasks) and deployed is one. With --rollout-url, the servers "
        "must serve INT4 the same way. --merge still writes MODEL's own weights plus the adapter (to train on; serve "
        "the policy RL trained with `glm5 serve MODEL --quant int4 --lora OUT/adapter`).",
    ),
    qlora: bool = typer.Option(
        False,
        "--qlora",
        help="Agentic: LoRA over the policy's base frozen as stored (FP8 as GLM-5-FP8 ships, glm5's INT4, or bf16), "
        "built on the meta device, each process reading only its shards. Under torchrun (`torchrun "
        "--nproc-per-node N -m glm5cli finetune rl MODEL --qlora ...`) the policy is sharded over the ranks: rank 0 "
        "runs the sessions against the rollout server (--rollout-engine process or --rollout-url) and every rank "
        "trains its share of each step's samples.",
    ),
    seed: int = typer.Option(0, help="Seed for task order, sampling and the LoRA initialisation."),
    save_every: int = typer.Option(
        10,
        min=0,
        help="completion: checkpoint every N steps; rerun resumes. Agentic (which checkpoints every step): also "
        "write the LoRA adapter of every N-th step and of the last to OUT/adapters/step-K (each servable: `glm5 "
        "serve MODEL --lora OUT/adapters/step-K`, for a learning curve measured by `glm5 bench`); 0: none.",
    ),
    suite: str | None = typer.Option(
        None, "--suite", help="swe / terminal: a named bench suite (builtin) in place of --tasks / task folders."
    ),
    eval_tasks: Path | None = typer.Option(
        None,
        "--eval-tasks",
        help="swe / terminal: held-out tasks (swe: a tasks file; terminal: a task folder or a folder of them), "
        "disjoint from the training tasks. Before training, every --save-every steps and after the last step, "
        "the pushed policy runs --eval-samples sessions per held-out task, graded by the bench; the solved rate "
        "goes into that step's rl_log.jsonl row (eval_solved_rate; before training: row 1's eval_before).",
    ),
    eval_samples: int = typer.Option(2, min=2, help="Agentic, with --eval-tasks: sessions per held-out task."),
    merge: bool = typer.Option(
        False,
        "--merge",
        help="Also write OUT as a plain checkpoint with the adapter merged in (for `glm5 serve`). To serve INT4, "
        "serve MODEL --quant int4 --lora OUT/adapter instead: rounding the merged weights to INT4 anew moves them "
        "further than a small adapter did.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
    trainer: str = typer.Option(
        "glm5",
        "--trainer",
        help="glm5: train here. slime: write OUT/prompts.jsonl and OUT/run-glm5-slime.sh, which run this RL on "
        "slime (Megatron + sglang, GLM-5's own trainer) at GLM-5's scale with glm5's agent, sandbox and grading "
        "as the rollout (--env swe / terminal).",
    ),
) -> None:
    """Reinforcement learning with GLM-5's objectives, on single completions or on whole agent sessions.

    --env completion: each step samples --group-size completions of --prompts-per-step tasks from the embedded
    engine, which serves the very model being trained (on-policy). Each is scored by its task's reward, and the
    LoRA adapters take a GRPO + IcePop step. A reward that cannot run for any completion of a step fails the run.

    --env swe / terminal / scripted: agentic RL. An orchestrator runs --concurrency agent sessions at once (the
    loop, tools and prompts of `glm5 code`, each in its own sandbox), token in, token out, against a rollout
    engine; the trainer trains on finished groups while sessions go on, pushes its weights after each step,
    and applies GLM-5's rules: --max-staleness, double-sided importance sampling (--is-low / --is-high),
    crashed-environment groups padded or dropped, optional optimizer reset; --sync is the synchronous baseline.

    Resumable: rerun the same command after a kill. OUT/rl_log.jsonl holds each step's rewards, solved rate,
    groups kept and dropped (and why), staleness, IS-masked fraction, logprob mismatch, KL, gradient norm,
    tokens/s and idle times. Serve the result with `glm5 serve MODEL --lora OUT/adapter` (or --merge).

    Learning curve: --save-every N keeps the adapter of every N-th step in OUT/adapters/step-K, to serve and
    measure with `glm5 bench` on held-out tasks; --eval-tasks HELD_OUT measures the pushed policy on them during
    the run (the bench's grading, --eval-samples sessions per task), into rl_log.jsonl.
    """
    if env not in ENVS:
        fail(f"--env must be one of {', '.join(ENVS)}, not {env!r}", code=EXIT_USAGE)
    if suite is not None:
        tasks_file, task_dirs = _suite(env, suite, tasks_file, task_dirs)
    if trainer not in ("glm5", "slime"):
        fail(f"--trainer must be glm5 or slime, not {trainer!r}", code=EXIT_USAGE)
    if agent_profile is not None and (env not in ("swe", "terminal") or agent_profile not in PROFILES):
        fail(f"--agent-profile {agent_profile}: one of {', '.join(PROFILES)}, for --env swe / terminal",
             code=EXIT_USAGE)  # fmt: skip
    if trainer == "slime":  # glm5cli/slime_cmd.py
        return write_slime_run(model, out, env, tasks_file, task_dirs or [], steps, prompts_per_step, group_size,
                               max_new_tokens, max_turns, temperature, lr, json_out, agent_profile)  # fmt: skip
    if env == "completion":
        for flag, given in (("--quant", quant is not None), ("--qlora", qlora)):
            if given:
                fail(f"{flag} is for agentic RL (--env swe / terminal / scripted)", code=EXIT_USAGE)
        if task_dirs:
            fail("task folders are for --env terminal; --env completion reads --tasks", code=EXIT_USAGE)
        if tasks_file is None:
            fail("--env completion needs --tasks (a prompts file with rewards)", code=EXIT_USAGE)
        # finetune's recipes import torch: imported here, not at the top (`glm5 --help`'s speed)
        from finetune.grpo_run import CompletionJob, completion_config

        with failing():
            cfg = completion_config(steps=steps, prompts_per_step=prompts_per_step, group_size=group_size,
                                    max_new_tokens=max_new_tokens, temperature=temperature, lr=lr,
                                    updates_per_batch=updates_per_batch, seed=seed)  # fmt: skip
        return _completion(CompletionJob(model, out, tasks_file, cfg, reward, rank, alpha, save_every, merge), json_out)
    from finetune.rl.config import RLConfig  # here, not at the top: `glm5 --help`'s speed

    try:
        cfg = RLConfig(
            steps=steps, groups_per_step=prompts_per_step, group_size=group_size, max_new_tokens=max_new_tokens,
            max_turns=max_turns, temperature=temperature, lr=lr, objective=objective, is_low=is_low,
            is_high=is_high, max_staleness=max_staleness, reset_optimizer=reset_optimizer, sync=sync,
            concurrency=concurrency, keep_reasoning=keep_reasoning, thinking=thinking, partial_credit=partial_credit,
            dynamic_sampling=dynamic_sampling, loss_agg=loss_agg, refusal_penalty=refusal_penalty,
            negative_weight=negative_weight, seed=seed,
        )  # fmt: skip
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)
    if rollout_engine not in (None, "thread", "process"):
        fail(f"--rollout-engine must be thread or process, not {rollout_engine!r}", code=EXIT_USAGE)
    if rollout_engine is not None and rollout_url:
        fail(f"--rollout-engine {rollout_engine} samples here; --rollout-url names servers: pick one", code=EXIT_USAGE)
    rollout_engine = rollout_engine or ("url" if rollout_url else "process")
    if quant not in (None, "int4"):
        fail(f"--quant must be int4, not {quant!r}", code=EXIT_USAGE)
    if eval_tasks is not None and env not in ("swe", "terminal"):
        fail("--eval-tasks is for --env swe / terminal (held-out bench tasks)", code=EXIT_USAGE)
    from finetune.rl.job import AgenticJob  # imports torch: here, not at the top (`glm5 --help`'s speed)

    job = AgenticJob(model, out, env, cfg, tasks_file, task_dirs or [], reward, rank, alpha, max_model_len,
                     rollout_url, merge, save_every, eval_tasks, eval_samples, rollout_engine, engine_threads, quant,
                     api_key=rollout_api_key or None, profile=agent_profile, qlora=qlora)  # fmt: skip
    _agentic(job, json_out)


def _suite(env: str, name: str, tasks_file: Path | None, task_dirs: list[Path] | None):
    """--suite NAME, as `glm5 bench --suite` reads it -> (the tasks file, the task folders) it materialized, in
    the bench's cache folder (.glm5-bench-cache/suites), reused by a rerun."""
    from agent.bench.suites import available  # here, not at the top: `glm5 --help`'s speed

    if env not in ("swe", "terminal"):
        fail("--suite is for --env swe / terminal (the bench's suites)", code=EXIT_USAGE)
    if tasks_file is not None or task_dirs:
        fail("give --suite or tasks (--tasks, task folders), not both", code=EXIT_USAGE)
    suites = available(env)
    if f"{env}:{name}" not in suites:
        known = ", ".join(k.split(":", 1)[1] for k in sorted(suites)) or "none"
        fail(f"no {env} suite named {name!r} (installed: {known})", code=EXIT_USAGE)
    paths = [Path(p) for p in suites[f"{env}:{name}"].materialize(Path(".glm5-bench-cache", "suites", env, name))]
    if env == "terminal":
        return None, paths
    if len(paths) != 1:
        fail(f"suite {name!r} has {len(paths)} task files; --env swe trains on one", code=EXIT_USAGE)
    return paths[0], []


def _agentic(job, json_out: bool) -> None:
    """Run agentic RL (finetune/rl/job.py) and print its summary."""
    from finetune.rl.job import AgenticRun  # imports torch: here, not at the top (`glm5 --help`'s speed)

    with failing():
        run = AgenticRun(job, ConsoleReporter())
        preflight(job.model, "rl", job.cfg.max_new_tokens, rank=job.rank)  # GPUs only: a lower bound (a session is longer)
        result = run.run()
    if result is None:  # a torchrun rank other than 0: rank 0 reports
        return
    if json_out:
        print_json(result)
        return
    model, out, cfg = job.model, job.out, job.cfg
    last = "" if result.get("reward_last") is None else f" -> {result['reward_last']:.3f} (last {result['window']})"
    quiet = f" ({result['groups_no_signal']} without signal)" if result.get("groups_no_signal") else ""
    console.print(
        f"[green]trained[/] {model} with agentic RL on {result['tasks']} {job.env} tasks for {cfg.steps} steps: mean "
        f"reward {result['reward_first']:.3f} (first {result['window']}){last}, {result['groups_dropped']} groups "
        f"dropped{quiet}, in {result['seconds']:.0f}s; adapter: {out / 'adapter'}"
    )
    if not result.get("held_out_solved_rate"):
        console.print("[dim]the rewards are of the train tasks each step drew, not a trend of the policy: "
                      "--eval-tasks measures held-out tasks at every --save-every step[/]")  # fmt: skip
    from finetune.lora import trained_quant  # loaded with the run above

    int4 = " --quant int4" if trained_quant(out / "adapter") == "int4" else ""  # --quant int4, or an INT4 --qlora base
    console.print(f"serve it with: glm5 serve {model}{int4} --lora {out / 'adapter'}")


def _completion(job, json_out: bool) -> None:
    """Run GRPO on single completions (finetune/grpo_run.py) and print its summary."""
    from finetune.grpo_run import run_completion_rl  # imports torch: here, not at the top (`glm5 --help`'s speed)

    with failing():
        summary = run_completion_rl(job, ConsoleReporter())
    if json_out:
        print_json(summary)
        return
    model, out, k = job.model, job.out, summary["window"]
    trend = (
        f"mean reward {summary['reward_first']:.3f} (first {k} steps) -> {summary['reward_last']:.3f} (last {k})"
        if summary["reward_last"] is not None
        else f"mean reward {summary['reward_first']:.3f} (one step)"
    )
    console.print(
        f"[green]trained[/] {model} with GRPO on {summary['tasks']} tasks ({summary['completions']} completions): "
        f"{trend}, policy-gradient norm {summary['pg_grad_norm_mean']:.3g} on average, in {summary['seconds']:.0f}s; "
        f"adapter: {out / 'adapter'}"
    )
    if summary["failed_checks"]:
        err_console.print(
            f"[yellow]{summary['failed_checks']} completions were left out: their reward check could not run"
        )
    if job.merge:
        # an RL adapter moves the weights little: merged and rounded to INT4 again, the rounding outweighs it
        console.print(f"serve it with: glm5 serve {out}   (with --quant int4: glm5 serve {model} --quant int4 "
                      f"--lora {out / 'adapter'}, which keeps RL's change exact)")  # fmt: skip
    else:
        console.print(f"serve it with: glm5 serve {model} --lora {out / 'adapter'}")
