"""`glm5 finetune distill`: cross-stage on-policy distillation (GLM-5 report §3.5). Parses and shows; the run is
finetune.distill (the loss and loop) and finetune.distill_run (teachers, prompts, the step log)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json


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
    from glm5cli.finetune_cmd import _checkpoint_tokenizer, _load_for_training, _Run, _TrainProgress

    if not teacher:
        fail("no teacher: give --teacher CKPT (or --teacher base, or DOMAIN=CKPT per domain)", code=EXIT_USAGE)
    if not prompts and not tasks:
        fail("nothing to distill on: give --prompts FILE and/or --tasks FILE", code=EXIT_USAGE)
    if kl not in ("full", "sampled"):
        fail(f"--kl must be full or sampled, not {kl!r}", code=EXIT_USAGE)
    from finetune.distill_run import check_domains, parse_teachers, read_prompts, split_domain

    try:
        teachers = parse_teachers(teacher)
        files = [(d, Path(f)) for d, f in map(split_domain, [*prompts, *tasks])]
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)
    if full and None in teachers.values():
        fail(
            "teacher `base` is the student with its adapter off, and --full trains no adapter",
            code=EXIT_USAGE,
            hint="drop --full, or give that domain the student's checkpoint as its teacher",
        )
    tok = _checkpoint_tokenizer(student)
    settings = {
        "student": str(student.resolve()),
        "teachers": {d: str(p.resolve()) if p else "base" for d, p in teachers.items()},
        "prompt_files": [[d, str(f.resolve())] for d, f in files],
        "steps": steps,
        "prompts_per_step": prompts_per_step,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "kl": kl,
        "lr": lr,
        "seed": seed,
        "full": full,
    }
    settings |= {} if full else {"rank": rank, "alpha": alpha, "merge": merge}
    run = _Run(out, settings)

    from finetune.distill import DistillConfig, Prompt, Teacher, train_distill
    from finetune.distill_run import StepLog, load_teacher

    saved = run.saved_sequences()
    try:
        if saved is not None:
            chosen = [Prompt(ids, d) for ids, d in saved["prompts"]]
        else:
            chosen = read_prompts(files, tok)
        check_domains(chosen, teachers)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)

    from glm5cli.plan_cmd import preflight

    longest = max((len(p.ids) for p in chosen), default=0) + max_new_tokens
    preflight(student, "full" if full else "distill", longest, rank=rank)  # GPUs only: the plan's check
    t0 = time.monotonic()
    net = _load_for_training(student, "distil into the full-precision checkpoint")
    limit = net.config.max_position_embeddings
    if too_long := [i for i, p in enumerate(chosen) if len(p.ids) + max_new_tokens > limit]:
        fail(f"{len(too_long)} prompt(s) + --max-new-tokens exceed the student's context ({limit})", code=EXIT_USAGE)
    models = {}
    with err_console.status("loading the teachers..."):
        for d, p in teachers.items():
            try:
                models[d] = Teacher.base() if p is None else Teacher.checkpoint(load_teacher(p, net.config))
            except ValueError as e:
                fail(str(e), code=EXIT_USAGE)
    named = None
    if full:
        from finetune.full import FullSettings, prepare_full

        named = prepare_full(net, FullSettings())
    else:
        from finetune.lora import LoraSettings, add_lora

        net = add_lora(net, LoraSettings(rank=rank, alpha=alpha), seed=seed)
    state = run.start({"prompts": [[p.ids, p.domain] for p in chosen]})
    log = StepLog(run.work / "train_log.jsonl", state["step"] if state else 0)
    by_domain = {d: sum(p.domain == d for p in chosen) for d in teachers}
    err_console.print(
        f"distilling on {len(chosen)} prompts: "
        + ", ".join(f"{n} {d} (teacher {settings['teachers'][d]})" for d, n in by_domain.items())
    )
    eos = net.config.eos_token_id
    stop = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    cfg = DistillConfig(
        steps=steps,
        lr=lr,
        warmup=max(1, steps // 20),
        prompts_per_step=prompts_per_step,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        kl=kl,
        seed=seed,
    )
    with _TrainProgress("distilling (full)" if full else "distilling (LoRA)", steps, state) as bar:

        def on_step(info) -> None:
            bar.on_step(info)
            log.write(info)

        loop = run.loop_args(state, save_every, bar) | {"on_step": on_step}
        try:
            hist = train_distill(net, chosen, models, cfg, stop=stop, named=named, **loop)
        except ValueError as e:  # a token outside the vocabulary
            fail(str(e), code=EXIT_USAGE)
    if full:
        from finetune.run_dir import write_checkpoint

        write_checkpoint(student, net, run.work)
    else:
        from glm5cli.finetune_cmd import _write_adapter

        _write_adapter(student, net, run.work, merge)
    summary = {
        "out": str(out),
        "adapter": None if full else str(out / "adapter"),
        "checkpoint": str(out) if merge or full else None,
        "prompts": by_domain,
        "steps": steps,
        "kl": kl,
        "reverse_kl_first": round(hist[0].lm, 4),
        "reverse_kl_last": round(sum(h.lm for h in hist[-10:]) / len(hist[-10:]), 4),
        # with either --kl, what is logged is the sampled estimate, not the full sum the loss may use
        "reverse_kl_is": "the mean log-ratio student/teacher at the sampled tokens (an estimate; can be negative)",
        "tokens_per_s": bar.tokens_per_s,
        "seconds": round(time.monotonic() - t0, 1),
    }
    # RunDir.finish drops its resume files (run.json among them); the record of the run stays in OUT.
    from finetune.run_dir import write_atomic

    write_atomic(run.work / "distill_run.json", json.dumps({"settings": settings, "summary": summary}, indent=1))
    run.finish()
    if json_out:
        print_json(summary)
        return
    console.print(
        f"[green]distilled[/] {student} on {len(chosen)} prompts, reverse KL to the teachers (sampled estimate: "
        f"the log-ratio at the sampled tokens) {summary['reverse_kl_first']:.3f} -> "
        f"{summary['reverse_kl_last']:.3f} nats/token, in "
        f"{summary['seconds']:.0f}s; " + (f"checkpoint: {out}" if full else f"adapter: {out / 'adapter'}")
    )
    if not full:
        console.print(f"serve it with: glm5 serve {student} --lora {out / 'adapter'}")
