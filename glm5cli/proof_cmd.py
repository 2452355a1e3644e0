"""`glm5 bench proof`: the training proof (finetune/proof) -- parse, run, show. Registered on the bench app."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json


def proof(
    out: Path = typer.Option(..., "--out", "-o", help="The run folder (a rerun resumes at the step it stopped in)."),
    smoke: bool = typer.Option(False, "--smoke", help="The smallest setting: tiny model, 2+1 tasks, 1 step each."),
    preset: str = typer.Option(
        None, "--preset", help="Model preset, tiny or small (default: tiny grown to ~4.6M parameters)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the task family, the model and every stage."),
    n_train: int = typer.Option(None, "--train", help="Train-split tasks (default 1000)."),
    n_heldout: int = typer.Option(None, "--heldout", help="Held-out tasks, the measurement (default 25)."),
    k: int = typer.Option(None, "-k", help="Attempts per held-out task (default 4): pass@k."),
    n: int = typer.Option(None, "-n", help="Trials (and RL sessions) at once (default 4)."),
    copy_steps: int = typer.Option(
        None,
        "--copy-steps",
        min=0,
        help="Steps of the base model's first phase from scratch: copy drills of made-up names (default 400; 0: none).",
    ),
    base_steps: int = typer.Option(
        None,
        "--base-steps",
        help="Steps of the base model's training on the corpus, after the copy phase (default 300).",
    ),
    sft_steps: int = typer.Option(None, "--sft-steps", help="Steps of SFT on the expert's trajectories (default 250)."),
    rl_steps: int = typer.Option(None, "--rl-steps", help="Steps of agentic RL on the train split (default 8)."),
    rl_curve_every: int = typer.Option(
        None,
        "--rl-curve-every",
        min=0,
        help="Every this many RL steps, bench the step's adapter on held-out and evaluate it on dev: the learning "
        "curve, ~3 min a point (default 4; 0: only before and after RL). With a long --rl-steps, raise it.",
    ),
    expert_slips: float = typer.Option(
        None,
        "--expert-slips",
        min=0.0,
        max=1.0,
        help="Share of train tasks on which the expert first fails an edit, then corrects it (default 0.5); "
        "SFT trains the correction, not the slip.",
    ),
    drill_numbers: float = typer.Option(
        None,
        "--drill-numbers",
        min=0.0,
        max=1.0,
        help="Share of the base's copy drills that are a comparison line with its constant (default 0.2; it raised "
        "SFT on held-out from 56 to 67/100, pass@4 from 68% to 92%: see benchmarks/RESULTS.md; 0: none).",
    ),
    threads: int = typer.Option(
        None,
        "--threads",
        min=0,
        help="Torch threads of every stage's process (0: each chooses by the cores free when it starts, "
        "glm5cli/threads.py; 1 is faster on a machine shared with other jobs).",
    ),
    agent_profile: str = typer.Option(
        None,
        "--agent-profile",
        metavar="<compact|full>",
        help="The agent profile of every session: compact "
        "(the default: 4 tools, a short prompt) or full (`glm5 code`'s default).",
    ),
    stages: str = typer.Option(
        None, "--stages", help="Comma-separated model stages, in order (base,sft,rl,forget,distill)."
    ),
    plan: bool = typer.Option(
        False, "--plan", help="Print each step, whether it is done, and its command; run nothing."
    ),
    force: bool = typer.Option(False, "--force", help="Continue a run folder made with another configuration."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """The training proof: GLM-5's post-training stages in miniature, each measured on held-out tasks.

    A generated family of one-line repair tasks (train and held-out share no function) -> an expert's sessions
    recorded by `glm5 bench swe` -> a GLM-5 model trained from scratch, first on copy drills of made-up names,
    then on synthetic sessions (base) -> SFT on the expert's -> agentic RL on train (dynamic sampling; its own
    evaluation on a dev split of held-out names, never the measurement) -> a forgetting stage (SFT on
    another task kind) -> on-policy distillation from the stage before forget. Every session uses the compact
    agent profile (4 tools, a short prompt: `glm5 code --profile compact`), so the model is served with the prompt
    it was trained on. After each stage the model is served as deployed (INT4, MTP) and benched on held-out with
    -k attempts; RUN/table.md holds the stage table, RUN/plots/ the plots.

    Example: glm5 bench proof --out runs/proof --smoke     (minutes: checks every step works)
    """
    from finetune.proof.config import ProofConfig, ProofConfigMismatch
    from finetune.proof.driver import run_proof

    given = {"preset": preset, "model": () if preset else None, "n_train": n_train, "n_heldout": n_heldout, "k": k,
             "concurrency": n, "copy_steps": copy_steps, "base_steps": base_steps, "sft_steps": sft_steps,
             "rl_steps": rl_steps, "rl_curve_every": rl_curve_every, "expert_slips": expert_slips,
             "drill_numbers": drill_numbers,
             "threads": threads, "agent_profile": agent_profile,
             "stages": tuple(s.strip() for s in stages.split(",") if s.strip()) if stages else None}  # fmt: skip
    given = {key: v for key, v in given.items() if v is not None}
    try:
        config = ProofConfig.smoke(seed=seed, **given) if smoke else ProofConfig(seed=seed, **given)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)

    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file; give a folder (a new one, or a run to resume)", code=EXIT_USAGE)

    def event(kind: str, data: dict) -> None:
        if kind == "start":
            err_console.print(f"[bold]{data['step']}[/] [dim]{data['command']}[/]", highlight=False)
        elif kind == "skip":
            err_console.print(f"[dim]{data['step']}: done before[/]")
        elif kind == "done":
            err_console.print(f"[green]{data['step']}[/] done in {data['seconds']} s")
        elif kind == "fail":
            err_console.print(f"[red]{data['step']} failed[/]: {data['reason']}", highlight=False)
        elif kind == "log":
            err_console.print(f"[dim]{data['message']}[/]", highlight=False)

    try:
        summary = run_proof(out, config, force=force, plan=plan, on_event=None if as_json else event)
    except ProofConfigMismatch as e:
        fail(str(e), code=EXIT_USAGE)
    except KeyboardInterrupt:
        fail(f"interrupted; rerun the same command to resume ({out})", code=130)
    if as_json:
        print_json(summary)
    elif plan:
        for s in summary["plan"]:
            console.print(
                f"{'done ' if s['done'] else 'to do'}  [bold]{s['step']:<16}[/] {s['command']}", highlight=False
            )
    else:
        console.print((Path(summary["run"]) / "table.md").read_text(), highlight=False)
        untimed = f" ({len(summary['untimed'])} steps made elsewhere, untimed)" if summary["untimed"] else ""
        console.print(f"end to end: {summary['seconds'] / 60:.1f} min of steps{untimed}", highlight=False)
    if not plan and not summary["complete"]:
        failed = next(s for s in summary["steps"] if s["status"] == "failed")
        fail(f"step {failed['step']} failed; fix it and rerun the same command to resume")
