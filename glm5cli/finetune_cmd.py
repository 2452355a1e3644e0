"""`glm5 finetune`: `sft` (LoRA on recorded responses), `rl` (GRPO on tasks with checkable rewards) and
`align-mtp` (the MTP layer on the model's own output)."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, fail, print_json
from glm5cli.distill_cmd import distill as distill_command
from glm5cli.help_format import WholeSummaries
from glm5cli.plan_cmd import plan_cmd as plan_command
from glm5cli.plan_cmd import preflight
from glm5cli.recipe_ui import ConsoleReporter, failing
from glm5cli.rl_cmd import rl as rl_command
from glm5cli.slime_cmd import export_sft
from glm5cli.stages_cmd import dsa_warmup

app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, cls=WholeSummaries
)  # plain help: readable at 80 columns (glm5cli/app.py)


@app.command("align-mtp")
def align_mtp_cmd(
    model: Path = typer.Argument(..., help="Checkpoint directory with an MTP layer."),
    out: Path = typer.Option(..., "--out", help="New checkpoint directory to write (must not exist)."),
    trajectories: list[Path] = typer.Option(
        [],
        "--trajectories",
        help="Trajectory files, or directories of them (e.g. .glm5/sessions), recorded by `glm5 code` with this "
        "model: their responses are trained on as they are (repeat the option for more).",
    ),
    prompts: Path | None = typer.Option(
        None,
        "--prompts",
        help='JSONL of prompts ({"prompt": text} or {"messages": [...]} per line): the model continues each '
        "(greedy) and the MTP layer is trained on those continuations.",
    ),
    max_new_tokens: int = typer.Option(128, min=1, help="Tokens generated per prompt."),
    steps: int = typer.Option(300, min=1, help="Training steps (MTP layer only)."),
    lr: float = typer.Option(3e-3, help="Peak learning rate (AdamW, warm-up then cosine)."),
    batch_size: int = typer.Option(8, min=1, help="Sequences per step."),
    max_len: int = typer.Option(2048, min=8, help="Longer sequences keep their last MAX_LEN tokens."),
    draft_vocab_size: int | None = typer.Option(
        None,
        min=0,
        help="Tokens in the draft vocabulary written beside the weights (ranked by how often the model produced "
        "them). Default: a sixteenth of the vocabulary, or more if that many tokens make up less than 99.9% of "
        "what the model generated here; 0: write none.",
    ),
    seed: int = typer.Option(0, help="Seed for batch order."),
    save_every: int = typer.Option(
        50, min=0, help="Checkpoint the training every N steps; rerunning the same command resumes (0: never)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
) -> None:
    """Train the MTP layer on the model's own output so that more of its drafts are accepted.

    Speculative decoding (`glm5 serve --speculative mtp`) is faster the more often the MTP layer's drafts are
    what the model would have said. This trains the MTP layer alone, on the model's recorded responses or on
    its continuations of your prompts; the rest of the model is not changed, so everything it outputs stays
    exactly the same. OUT gets the checkpoint (tokenizer and templates copied from MODEL) and, unless
    --draft-vocab-size 0, a draft_vocab.json for `glm5 serve --draft-vocab`.

    The run works in .OUT.partial beside OUT and renames it into place at the end. A run that is killed resumes
    from its last checkpoint when the same command is run again (the generated data is kept too).
    """
    if not trajectories and prompts is None:
        fail("nothing to train on: give --trajectories and/or --prompts", code=EXIT_USAGE)
    # finetune's recipes import torch: imported here, not at the top (`glm5 --help`'s speed)
    from finetune.mtp_align_run import AlignJob, run_align_mtp

    job = AlignJob(model, out, trajectories, prompts, max_new_tokens, steps, lr, batch_size, max_len,
                   draft_vocab_size, seed, save_every)  # fmt: skip
    with failing():
        summary = run_align_mtp(job, ConsoleReporter())
    if json_out:
        print_json(summary)
        return
    console.print(
        f"[green]aligned[/] the MTP layer of {model} on {summary['sequences']} sequences "
        f"({summary['trained_tokens']:,} model tokens), MTP loss {summary['mtp_loss_first']:.3f} -> "
        f"{summary['mtp_loss_last']:.3f}, in {summary['seconds']:.0f}s; wrote {out}"
    )
    vocab = summary["draft_vocab"]
    serve = f"glm5 serve {out} --speculative mtp" + (f" --draft-vocab {out / 'draft_vocab.json'}" if vocab else "")
    console.print(f"serve it with: {serve}")


_MERGE = typer.Option(
    False, "--merge", help="Also write OUT as a plain checkpoint with the adapter merged in (for `glm5 serve`)."
)
_RANK = typer.Option(16, min=1, help="LoRA rank.")
_ALPHA = typer.Option(32, min=1, help="LoRA alpha (the update is scaled by alpha / rank).")


@app.command("sft")
def sft(
    model: Path = typer.Argument(..., help="Checkpoint directory (full precision)."),
    out: Path = typer.Option(
        ..., "--out", help="New directory: the adapter in OUT/adapter; with --merge, OUT is a checkpoint."
    ),
    data: list[Path] = typer.Option(
        ...,
        "--data",
        "--trajectories",
        help="Training data, files or folders (repeat for more): glm5 trajectories (.glm5/sessions), `glm5 bench` "
        "run folders, OpenAI chat JSONL ({messages, tools} per line), mini-swe-agent .traj.json, Harbor (ATIF) "
        "trajectory.json. The format is told from the content.",
    ),
    steps: int = typer.Option(200, min=1, help="Training steps."),
    lr: float = typer.Option(2e-4, help="Peak learning rate (AdamW, warm-up then cosine)."),
    rank: int = _RANK,
    alpha: int = _ALPHA,
    batch_size: int = typer.Option(4, min=1, help="Sequences per step."),
    max_len: int = typer.Option(
        4096, min=8, help="Longer sequences keep their first MAX_LEN tokens (the full agent profile's prompt is ~2.6k)."
    ),
    seed: int = typer.Option(0, help="Seed for batch order."),
    include_denied: bool = typer.Option(
        False, help="Also train on turns whose tool calls were denied or blocked (default: context only)."
    ),
    include_format_errors: bool = typer.Option(
        False, help="Also train on turns with a malformed tool call (default: context only)."
    ),
    include_failed_calls: bool = typer.Option(
        False,
        help="Also train on turns whose tool call the tool refused as made, such as an edit whose old_string is "
        "not in the file (default: context only, as GLM-5 masks erroneous segments; a failing test run is trained).",
    ),
    only_resolved: bool | None = typer.Option(
        None,
        "--only-resolved/--all-outcomes",
        help="Keep only trials whose tests passed. Default: on for `glm5 bench` runs, off for other data.",
    ),
    min_reward: float | None = typer.Option(None, help="Keep only trials with at least this reward."),
    strict: bool = typer.Option(False, help="Fail on the first bad record instead of skipping and reporting it."),
    allow_foreign: bool = typer.Option(
        False,
        "--allow-foreign",
        help="Train on glm5 trajectories this machine did not record too (a repository's committed "
        ".glm5/sessions, another machine's bench run). Default: skipped, each named.",
    ),
    pack: bool = typer.Option(
        False,
        help="Pack short sequences into rows of --max-len tokens (each attends only to itself and counts its "
        "positions from 0: the same loss, less padding); --batch-size then counts rows.",
    ),
    micro_batch: int = typer.Option(
        0,
        min=0,
        help="Rows per forward/backward; gradients accumulate over the batch, which then needs less "
        "memory (0: the whole batch at once).",
    ),
    full: bool = typer.Option(
        False, "--full", help="Full fine-tuning instead of LoRA: OUT is a checkpoint (MTP layer and indexer frozen)."
    ),
    train_mtp: bool = typer.Option(
        False,
        help="With --full, train the MTP layer too, by GLM-5's chained MTP loss on the same targets (weight 0.3) "
        "beside the LM loss (default: frozen; align-mtp after).",
    ),
    mtp_steps: int = typer.Option(
        3, min=1, help="With --train-mtp, the recursive MTP steps of that loss (GLM-5: 3, sharing the one layer)."
    ),
    router_bias_rate: float = typer.Option(
        0.0,
        min=0.0,
        help="With --full, update the routers' bias by the auxiliary-loss-free balancing rule at this rate "
        "(DeepSeek-V3: 1e-3); 0 keeps it frozen.",
    ),
    qat: str | None = typer.Option(
        None,
        "--qat",
        metavar="<int4>",
        help="Quantization-aware training: 'int4' trains through the same group-wise INT4 rounding that `glm5 model "
        "quantize` applies (of the merged weights with LoRA, which then needs --merge), straight-through "
        "gradients; OUT/int4 is then the INT4 checkpoint to serve.",
    ),
    qat_group_size: int = typer.Option(
        128, help="With --qat int4: input columns per scale, as `glm5 model quantize --group-size` (32-256)."
    ),
    save_every: int = typer.Option(
        50, min=0, help="Checkpoint the training every N steps; rerunning the same command resumes (0: never)."
    ),
    dense_attention: bool = typer.Option(
        False,
        help="Train with every key visible (the DSA indexers' top-k off; the checkpoint keeps its index_topk): "
        "a model trained from scratch learns attention before an untrained indexer hides keys from it, then "
        "`glm5 finetune dsa-warmup` trains the indexers, as GLM-5 went from dense training to DSA.",
    ),
    merge: bool = _MERGE,
    qlora: bool = typer.Option(
        False,
        "--qlora",
        help="LoRA over the base frozen as stored (FP8 as GLM-5-FP8 ships, glm5's INT4, or bf16), dequantised per "
        "layer in the forward; the model is built on the meta device and each process reads only its shards "
        "(under torchrun: 1/N of the checkpoint each); each decoder layer is recomputed in the backward.",
    ),
    offload_optimizer: bool = typer.Option(
        False,
        "--offload-optimizer",
        help="Keep AdamW's state (its two moments and an fp32 copy of what trains) in host memory and step it on "
        "the CPU: GPU memory holds only the trained weights and their gradients (`glm5 finetune plan "
        "--offload-optimizer` shows the difference). The same update; each step copies the gradients out and the "
        "weights back.",
    ),
    export_slime: bool = typer.Option(
        False,
        "--export-slime",
        help="Train nothing: write the token ids and target masks built from --data to OUT/sft.jsonl, for slime's "
        "SFT with --rollout-function-path finetune.slime.sft.generate_rollout (finetune/slime/sft.py).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
) -> None:
    """Supervised fine-tuning (LoRA, or --full) on what an agent recorded.

    Each session becomes one sequence per branch (a compaction or rewind starts a new branch) in which every
    model turn is a target: its reasoning, content, tool calls and the token that ended it; everything else
    (system, user, tool results) is context. Recorded token ids are trained as they were sampled; data
    without them is rendered with GLM-5's chat template. A response cut at max_tokens gets no end token. Turns
    whose tool calls were denied, blocked or malformed stay as context, not targets (flags to include them).
    A bad record is skipped and reported with its file and line (--strict to fail).

    LoRA adapters (peft) go on the attention and MLP linears of the main layers; everything else stays frozen.
    The adapter is written in peft's format; --merge also writes a checkpoint `glm5 serve` loads. Resumable
    like align-mtp; run `glm5 finetune align-mtp` on the result afterwards so that speculative decoding keeps up
    (or, with --full, --train-mtp: the MTP layer trains along by GLM-5's MTP loss).

    Data-parallel on several processes: `torchrun --nproc-per-node N -m glm5cli finetune sft ...` shards the
    model with FSDP2 and each step's batch over the N ranks (the same global batch, the same loss curve as one
    process); rank 0 prints and writes. Its checkpoints resume at any other number of processes, one included.
    """
    # finetune's recipes import torch: imported here, not at the top (`glm5 --help`'s speed)
    from finetune.data.trajectories import DataOptions
    from finetune.sft_run import SFTJob, SFTRun

    opts = DataOptions(include_denied, include_format_errors, include_failed_calls, only_resolved, min_reward, strict,
                       max_len, allow_foreign)  # fmt: skip
    job = SFTJob(model, out, data, opts, steps, lr, rank, alpha, batch_size, max_len, seed, pack, micro_batch, full,
                 train_mtp, mtp_steps, router_bias_rate, qat, qat_group_size, save_every, dense_attention, merge,
                 qlora, offload_optimizer)  # fmt: skip
    with failing():
        run = SFTRun(job, ConsoleReporter())
        if export_slime:  # the data only, for slime (glm5cli/slime_cmd.py)
            return export_sft(out, *run.data(), json_out)
        preflight(model, "full" if full else "sft", max_len, micro_batch or batch_size, rank,  # GPUs only: the plan
                  offload=offload_optimizer)  # fmt: skip
        summary = run.run()
    if summary is not None:  # None: a torchrun rank other than 0
        _print_sft(summary, job, json_out)


def _print_sft(summary: dict, job, json_out: bool) -> None:
    if json_out:
        print_json(summary)
        return
    out, full, merge = job.out, job.full, job.merge
    how = "fully" if full else f"with LoRA (rank {job.rank})"
    console.print(
        f"[green]fine-tuned[/] {job.model} {how} on {summary['examples']} sequences "
        f"({summary['trained_tokens']:,} target tokens), loss {summary['loss_first']:.3f} -> "
        f"{summary['loss_last']:.3f}, in {summary['seconds']:.0f}s; "
        + (f"checkpoint: {out}" if full else f"adapter: {out / 'adapter'}")
    )
    if (merge or full) and job.train_mtp:
        console.print(f"serve it with: glm5 serve {out}   (its MTP layer was trained along: mtp loss "
                      f"{summary['mtp_loss_last']:.3f})")  # fmt: skip
    elif merge or full:
        console.print(f"serve it with: glm5 serve {out}   (then `glm5 finetune align-mtp {out} ...` for MTP drafts)")
    if job.qat is not None:
        console.print(f"the INT4 weights it was trained for: glm5 serve {out / 'int4'}")


app.command("rl")(rl_command)  # `glm5 finetune rl` lives in rl_cmd.py
app.command("distill")(distill_command)  # `glm5 finetune distill` lives in distill_cmd.py
app.command("dsa-warmup")(dsa_warmup)  # GLM-5's DSA adaptation stage lives in stages_cmd.py
app.command("plan")(plan_command)  # `glm5 finetune plan` lives in plan_cmd.py
