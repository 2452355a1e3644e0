"""GLM-5's DSA adaptation stage on the `glm5 finetune` app: `dsa-warmup` (the DSA indexer's dense warm-up, then
sparse training). Registered in finetune_cmd.py; parses and prints: the run is finetune/dsa_warmup_run.py."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, fail, print_json
from glm5cli.recipe_ui import ConsoleReporter, failing


def dsa_warmup(
    model: Path = typer.Argument(..., help="Checkpoint directory (full precision) with DSA indexers."),
    out: Path = typer.Option(..., "--out", help="New checkpoint directory to write (must not exist)."),
    data: list[Path] = typer.Option(
        ...,
        "--data",
        "--trajectories",
        help="Training data, files or folders, as for `glm5 finetune sft` (glm5 trajectories, bench runs, OpenAI "
        "chat JSONL, mini-swe-agent, Harbor ATIF); repeat for more.",
    ),
    warmup_steps: int = typer.Option(100, min=0, help="Dense warm-up steps (indexers only, the model frozen)."),
    lr: float = typer.Option(1e-3, help="Peak learning rate of the warm-up (DeepSeek-V3.2: 1e-3)."),
    sparse_steps: int = typer.Option(
        0, min=0, help="Sparse training steps after the warm-up (main model on the LM loss, indexers on their KL)."
    ),
    sparse_lr: float = typer.Option(1e-5, help="Peak learning rate of the sparse stage (both parts)."),
    batch_size: int = typer.Option(4, min=1, help="Sequences per step."),
    max_len: int = typer.Option(2048, min=8, help="Longer sequences keep their first MAX_LEN tokens."),
    seed: int = typer.Option(0, help="Seed for batch order."),
    save_every: int = typer.Option(
        50, min=0, help="Checkpoint the training every N steps; rerunning the same command resumes (0: never)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
) -> None:
    """Train the DSA lightning indexer to pick the keys the attention weighs most (DeepSeek-V3.2's recipe).

    Dense warm-up: the model attends to every key and stays frozen (bit for bit); each layer's indexer learns,
    by KL divergence, the distribution of that layer's attention summed over heads (the MTP layer's too, on its
    first draft step). Then, with --sparse-steps, sparse training: attention over the indexer's top-k, the main
    model on the LM loss of the data's model turns, each main indexer on the KL over the keys it selected, its
    input detached so the two never mix (the MTP layer stays frozen). Needed after anything that changes attention (a new context length, a dense model
    given DSA); OUT is a checkpoint for `glm5 serve`, with train_log.jsonl (one line per step) and
    dsa_warmup.json (the settings and the summary). A killed run resumes when the same command is rerun.
    """
    if warmup_steps == 0 and sparse_steps == 0:
        fail("nothing to do: --warmup-steps and --sparse-steps are both 0", code=EXIT_USAGE)
    # finetune's recipes import torch: imported here, not at the top (`glm5 --help`'s speed)
    from finetune.dsa_warmup_run import DSAJob, DSAWarmupRun

    job = DSAJob(model, out, data, warmup_steps, lr, sparse_steps, sparse_lr, batch_size, max_len, seed, save_every)
    with failing():
        summary = DSAWarmupRun(job, ConsoleReporter(show_data=not json_out)).run()
    if json_out:
        print_json(summary)
        return
    line = f"[green]warmed up[/] the indexers of {model}"
    if summary["kl_first"] is not None:
        line += f": KL to dense attention {summary['kl_first']:.4g} -> {summary['kl_last']:.4g}"
    if summary["sparse_loss_first"] is not None:
        line += f"; sparse LM loss {summary['sparse_loss_first']:.3f} -> {summary['sparse_loss_last']:.3f}"
    console.print(f"{line}, in {summary['seconds']:.0f}s; wrote {out}")
    console.print(f"serve it with: glm5 serve {out}")
