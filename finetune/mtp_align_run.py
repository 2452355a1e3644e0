"""The recipe of `glm5 finetune align-mtp`: everything it does once its options are parsed (moved from
glm5cli/finetune_cmd.py).

    summary = run_align_mtp(AlignJob(model, out, trajectories, prompts, ...), reporter)

The run folder opens (or resumes, with the data it generated) -> the recorded responses of the trajectories and
the model's greedy continuations of the prompts (finetune/mtp_align.py) -> align_mtp trains the MTP layer alone
-> the draft vocabulary is ranked -> OUT gets the checkpoint and draft_vocab.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from finetune import mtp_align
from finetune.artifacts import write_checkpoint
from finetune.data.trajectories import truncated
from finetune.errors import RunError, UsageError
from finetune.loading import checkpoint_tokenizer, load_for_training, prompt_rows, recorded_sequences, trajectory_files
from finetune.mtp_objective import MTPTrainConfig
from finetune.recipe import Reporter, Run, tail_mean
from finetune.train_loop import OptimConfig
from serve.engine.spec_decode import write_draft_vocab


@dataclass(frozen=True)
class AlignJob:
    """`glm5 finetune align-mtp`'s options, parsed (see its --help for each)."""

    model: Path
    out: Path
    trajectories: list[Path]
    prompts: Path | None = None
    max_new_tokens: int = 128
    steps: int = 300
    lr: float = 3e-3
    batch_size: int = 8
    max_len: int = 2048
    draft_vocab_size: int | None = None
    seed: int = 0
    save_every: int = 50


def run_settings(job: AlignJob, files: list[Path]) -> dict:
    return {
        "model": str(job.model.resolve()),
        "trajectories": [str(f.resolve()) for f in files],
        "prompts": str(job.prompts.resolve()) if job.prompts else None,
        "max_new_tokens": job.max_new_tokens,
        "steps": job.steps,
        "lr": job.lr,
        "batch_size": job.batch_size,
        "max_len": job.max_len,
        "seed": job.seed,
    }


def _generated(job: AlignJob, net, prompt_ids: list[list[int]], reporter: Reporter) -> list[tuple[list[int], int]]:
    """The model's greedy continuation of each prompt, with a step bar."""
    if not prompt_ids:
        return []
    with reporter.steps() as bar:
        task = bar.add_task("generating", total=len(prompt_ids))
        try:
            return mtp_align.generate_sequences(
                net, prompt_ids, job.max_new_tokens, progress=lambda done, _: bar.update(task, completed=done)
            )
        except ValueError as e:  # a prompt too long for the context, a token outside the vocabulary
            raise UsageError(f"{job.prompts}: {e}") from None


def _draft_vocab(job: AlignJob, net, seqs) -> list[int] | None:
    if job.draft_vocab_size == 0:
        return None
    size = job.draft_vocab_size or mtp_align.default_draft_vocab_size(seqs, net.config.vocab_size)
    # Past the tokens the model produced: the tokens of the prompts, then the lowest ids (BPE merge order,
    # roughly how common a token is).
    rest = [t for s, p in seqs for t in s[:p]] + list(range(net.config.vocab_size))
    return mtp_align.draft_vocab(seqs, size=min(size, net.config.vocab_size), fallback=rest)


def run_align_mtp(job: AlignJob, reporter: Reporter) -> dict:
    """Align the MTP layer of job.model and write job.out -> the summary."""
    tok = checkpoint_tokenizer(job.model)
    files = trajectory_files(job.trajectories)
    run = Run(job.out, run_settings(job, files), reporter=reporter)
    seqs: list[tuple[list[int], int]] = []
    prompt_ids: list[list[int]] = []
    saved = run.saved_sequences()
    if saved is not None:
        seqs, n_recorded = [(s, p) for s, p in saved["sequences"]], saved["from_trajectories"]
    else:
        seqs = recorded_sequences(files, tok)
        n_recorded = len(seqs)
        if job.prompts is not None:
            prompt_ids = [ids for ids, _, _ in prompt_rows(job.prompts, tok)]
    t0 = time.monotonic()
    net = load_for_training(job.model, "align the full-precision checkpoint, then `glm5 model quantize` the result",
                            reporter.status)  # fmt: skip
    if net.config.num_nextn_predict_layers < 1:
        raise RunError(f"{job.model} has no MTP layer to align (num_nextn_predict_layers is 0)")
    seqs += _generated(job, net, prompt_ids, reporter)
    seqs = truncated(seqs, job.max_len)
    if not any(len(s) > p for s, p in seqs):
        raise RunError("no model output to train on (the trajectories hold no assistant responses)")
    state = run.start({"sequences": seqs, "from_trajectories": n_recorded})
    cfg = MTPTrainConfig(OptimConfig(steps=job.steps, lr=job.lr, warmup=max(1, job.steps // 20)), train_main=False)
    with reporter.training("aligning the MTP layer", job.steps, state) as tbar:
        hist = mtp_align.align_mtp(net, seqs, cfg, batch_size=job.batch_size, seed=job.seed,
                                   **run.loop_args(state, job.save_every, tbar))  # fmt: skip
    vocab = _draft_vocab(job, net, seqs)
    # The checkpoint is assembled in the work directory and renamed into place: OUT is complete or absent.
    write_checkpoint(job.model, net, run.work)
    summary = {
        "out": str(job.out),
        "sequences": len(seqs),
        "from_trajectories": n_recorded,
        "from_prompts": len(seqs) - n_recorded,
        "trained_tokens": sum(len(s) - p for s, p in seqs),
        "steps": job.steps,
        "mtp_loss_first": round(hist[0].mtp_mean, 4),
        "mtp_loss_last": round(tail_mean([h.mtp_mean for h in hist]), 4),
        "draft_vocab": str(job.out / "draft_vocab.json") if vocab else None,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if vocab:
        write_draft_vocab(run.work / "draft_vocab.json", vocab, source=f"glm5 finetune align-mtp {job.model}")
    run.finish()
    return summary
