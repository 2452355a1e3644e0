"""`glm5 finetune distill`: cross-stage on-policy distillation (GLM-5 report §3.5). Parses and shows; the run is
finetune.distill (the loss and loop) and finetune.distill_run (teachers, prompts, the step log, the recipe)."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, fail, print_json
from glm5cli.plan_cmd import preflight
from glm5cli.recipe_ui import ConsoleReporter, failing


def distill(
    student: Path = typer.Argument(..., help="The student: a checkpoint directory (full precision)."),
    teacher: list[str] = typer.Option(
        [],
        "--teacher",
        help="[DOMAIN=]TEACHER, repeat for more: a checkpoint directory, a LoRA adapter directory (merged into the "
        "base it recorded), or `base` (the student itself with its new adapter off: no second copy in memory). "
        "Each prompt is scored by its domain's teacher; without DOMAIN= the domain is `default`.",
    ),
    prompts: list[str] = typer.Option(
        [],
        "--prompts",
        help='[DOMAIN=]FILE, repeat for more: JSONL, {"prompt": text} or {"messages": [...]} a line (a line\'s '
        '"domain" overrides). The student completes them; nothing else of the file is used.',
    ),
    tasks: list[str] = typer.Option(
        [],
        "--tasks",
        help="[DOMAIN=]FILE: a `glm5 finetune rl --env completion` tasks file, read as prompts (each task's "
        "reward is not used: the teacher is the signal).",
    ),
    out: Path = typer.Option(
        ..., "--out", help="New directory: the adapter in OUT/adapter (with --full or --merge, OUT is a checkpoint)."
    ),
    steps: int = typer.Option(100, min=1, help="Optimizer steps."),
    prompts_per_step: int = typer.Option(8, min=1, help="Prompts sampled and scored per step."),
    max_new_tokens: int = typer.Option(256, min=1, help="Longest completion the student samples."),
    temperature: float = typer.Option(1.0, min=0.0, help="Sampling temperature (the KL compares the same)."),
    kl: str = typer.Option(
        "full",
        "--kl",
        metavar="<full|sampled>",
        help="full: the reverse KL over the whole vocabulary at each sampled position (the default: it pulls "
        "the student towards tokens it no longer samples, which a forgotten skill needs). sampled: the report's "
        "Eq. 2, the log-ratio of the sampled token as its advantage (one token's information a position: fine "
        "when the student still samples what the teacher would, slow to bring back what it has lost).",
    ),
    lr: float = typer.Option(1e-3, help="Peak learning rate (AdamW, warm-up then cosine)."),
    rank: int = typer.Option(16, min=1, help="LoRA rank."),
    alpha: int = typer.Option(32, min=1, help="LoRA alpha (the update is scaled by alpha / rank)."),
    full: bool = typer.Option(
        False, "--full", help="Train all the student's weights (MTP layer and indexer frozen): OUT is a checkpoint."
    ),
    merge: bool = typer.Option(False, "--merge", help="Also write OUT as a checkpoint with the adapter merged in."),
    qlora: bool = typer.Option(
        False,
        "--qlora",
        help="LoRA over the student's base frozen as stored (FP8 as GLM-5-FP8 ships, glm5's INT4, or bf16), "
        "dequantised per layer; each process reads only its shards, and teacher checkpoints are loaded the same "
        "way. Under torchrun (`torchrun --nproc-per-node N -m glm5cli finetune distill --qlora ...`) each rank "
        "holds 1/N of the student and of each teacher and samples and scores 1/N of each step's prompts.",
    ),
    seed: int = typer.Option(0, help="Seed for prompt order, sampling and the LoRA initialisation."),
    save_every: int = typer.Option(
        10, min=0, help="Checkpoint the training every N steps; rerunning the same command resumes (0: never)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
) -> None:
    """Bring back what a later training stage made the model forget, by on-policy distillation from the earlier
    stage's checkpoint (GLM-5's final, cross-stage stage).

    Each step the student samples completions of --prompts-per-step prompts; each prompt's teacher (by its
    domain) scores the same tokens, and the student is trained on the per-token reverse KL to the teacher at
    the positions it sampled. A teacher is an earlier stage's checkpoint or adapter, or `base`: the student's
    own weights with the LoRA adapter being trained switched off, which keeps what the student already does on
    those prompts (a guard against losing it while the other domains are distilled).

    LoRA by default: OUT/adapter, served with `glm5 serve STUDENT --lora OUT/adapter`. Per-step numbers go to
    OUT/train_log.jsonl, the settings and a summary to OUT/distill_run.json. The run works in .OUT.partial and is renamed into place at
    the end; a killed run resumes from its last checkpoint when the same command is run again.
    """
    if not teacher:
        fail("no teacher: give --teacher CKPT (or --teacher base, or DOMAIN=CKPT per domain)", code=EXIT_USAGE)
    if not prompts and not tasks:
        fail("nothing to distill on: give --prompts FILE and/or --tasks FILE", code=EXIT_USAGE)
    if kl not in ("full", "sampled"):
        fail(f"--kl must be full or sampled, not {kl!r}", code=EXIT_USAGE)
    # finetune's recipes import torch: imported here, not at the top (`glm5 --help`'s speed)
    from finetune.distill_run import DistillJob, DistillRun

    job = DistillJob(student, out, teacher, [*prompts, *tasks], steps, prompts_per_step, max_new_tokens, temperature,
                     kl, lr, rank, alpha, full, merge, seed, save_every, qlora)  # fmt: skip
    with failing():
        run = DistillRun(job, ConsoleReporter())
        preflight(student, "full" if full else "distill", run.longest, rank=rank)  # GPUs only: the plan's check
        summary = run.run()
    if summary is None:  # a torchrun rank other than 0: rank 0 reports
        return
    if json_out:
        print_json(summary)
        return
    console.print(
        f"[green]distilled[/] {student} on {len(run.prompts)} prompts, reverse KL to the teachers (sampled estimate: "
        f"the log-ratio at the sampled tokens) {summary['reverse_kl_first']:.3f} -> "
        f"{summary['reverse_kl_last']:.3f} nats/token, in "
        f"{summary['seconds']:.0f}s; " + (f"checkpoint: {out}" if full else f"adapter: {out / 'adapter'}")
    )
    if not full:
        console.print(f"serve it with: glm5 serve {student} --lora {out / 'adapter'}")
