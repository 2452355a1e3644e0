"""GLM-5's adaptation stages on the `glm5 finetune` app: `dsa-warmup` (the DSA indexer's dense warm-up, then
sparse training), and the `--qat int4` helpers of `glm5 finetune sft`. Registered in finetune_cmd.py; the
training itself is finetune/dsa_warmup.py and finetune/qat.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json

STAGES = ("warmup", "warmup_done", "sparse")  # what a checkpoint's "stage" says, in run order


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
    from glm5cli import finetune_cmd as ft

    tok = ft._checkpoint_tokenizer(model)
    from finetune.data.trajectories import DataOptions
    from finetune.dsa_warmup import (
        DSAWarmupConfig,
        indexer_layers,
        indexer_parameters,
        train_dense_warmup,
        train_sparse,
    )
    from finetune.run_dir import RunDir, RunError

    opts = DataOptions(max_len=max_len)
    settings = {"command": "dsa-warmup", "model": str(model.resolve()), "data": [str(p.resolve()) for p in data]}
    settings |= {"warmup_steps": warmup_steps, "lr": lr, "sparse_steps": sparse_steps, "sparse_lr": sparse_lr}
    settings |= {"batch_size": batch_size, "max_len": max_len, "seed": seed}
    try:
        run = RunDir(out, settings)
    except RunError as e:
        fail(str(e), hint=e.hint)
    saved = run.saved_sequences()
    if saved is not None:
        seqs, report = [(s, [bool(x) for x in m]) for s, m in saved["sequences"]], saved["report"]
    else:
        seqs, report = ft._load_data(data, tok, opts)
    if not seqs:
        fail("no sequences to train on", hint=ft._filtered_hint(report))
    t0 = time.monotonic()
    net = ft._load_for_training(model, "run the warm-up on the full-precision checkpoint, then quantize the result")
    if not indexer_layers(net):
        fail(f"{model} has no DSA indexer (no layer with its own indexer): nothing to warm up")
    from finetune.resume_state import check_dsa_state

    state = run.start(
        {"sequences": [[s, [int(x) for x in m]] for s, m in seqs], "report": report}, check=check_dsa_state
    )
    stage = state["stage"] if state else "warmup"
    if state:
        err_console.print(f"resuming {run.work} at the {stage} stage, step {state['step']}")
    log = _StepLog(run.work / "train_log.jsonl", state)
    cfg = DSAWarmupConfig(warmup_steps, lr, sparse_steps, sparse_lr, batch_size, seed)
    if not json_out:
        ft._show_data(report, json_out)

    kl_hist: list[float] = state.get("warmup_kl", []) if state else []
    tps: list[float] = []
    if stage == "warmup" and warmup_steps:
        with ft._TrainProgress("warm-up (indexer KL)", warmup_steps, state) as bar:

            def warm_step(info) -> None:
                bar.on_step(info)
                log.write({"stage": "warmup", "step": info.step, "kl": info.loss.lm, "lr": info.lr}, info)

            hist = train_dense_warmup(
                net,
                seqs,
                cfg,
                resume=state,
                save=lambda st: run.save(st | {"stage": "warmup"}),
                save_every=save_every,
                on_step=warm_step,
            )
        kl_hist = [h.lm for h in hist]
        tps.append(bar.tokens_per_s or 0.0)
        state = None
        if sparse_steps:  # the warm-up's result, so that a kill during the sparse stage does not redo it
            indexer = {n: p.detach().clone() for n, p in indexer_parameters(net, mtp=True)}
            run.save({"stage": "warmup_done", "step": warmup_steps, "indexer": indexer, "warmup_kl": kl_hist})
    elif stage == "warmup_done":
        _load_indexer(net, state["indexer"])
        state = None
    sparse_hist = []
    if sparse_steps:
        # the sparse stage does not train the MTP layer's indexer: its warmed-up values ride along in every
        # checkpoint, so a run resumed here does not serve the MTP layer with its initial indexer
        main_ix = {n for n, _ in indexer_parameters(net)}
        if state and state.get("stage") == "sparse":
            _load_indexer(net, state.get("mtp_indexer", {}))
        mtp_ix = {n: p.detach().clone() for n, p in indexer_parameters(net, mtp=True) if n not in main_ix}
        with ft._TrainProgress("sparse training (LM)", sparse_steps, state) as bar:

            def sparse_step(info) -> None:
                kl = info.loss.mtp[0]
                info.loss.mtp = []  # the bar's "mtp" column would mislabel the indexer's KL
                bar.on_step(info)
                info.loss.mtp = [kl]
                log.write({"stage": "sparse", "step": info.step, "lm": info.loss.lm, "kl": kl, "lr": info.lr}, info)

            sparse_hist = train_sparse(
                net,
                seqs,
                cfg,
                resume=state,
                save=lambda st: run.save(st | {"stage": "sparse", "warmup_kl": kl_hist, "mtp_indexer": mtp_ix}),
                save_every=save_every,
                on_step=sparse_step,
            )
        tps.append(bar.tokens_per_s or 0.0)
    ft._write_checkpoint(model, net, run.work)
    summary = {
        "out": str(out),
        "sequences": len(seqs),
        "warmup_steps": warmup_steps,
        "kl_first": round(kl_hist[0], 6) if kl_hist else None,
        "kl_last": round(_tail_mean(kl_hist), 6) if kl_hist else None,
        "sparse_steps": sparse_steps,
        "sparse_loss_first": round(sparse_hist[0].lm, 4) if sparse_hist else None,
        "sparse_loss_last": round(_tail_mean([h.lm for h in sparse_hist]), 4) if sparse_hist else None,
        "sparse_kl_last": round(_tail_mean([h.mtp[0] for h in sparse_hist]), 6) if sparse_hist else None,
        "tokens_per_s": round(min(tps), 1) if tps else None,
        "seconds": round(time.monotonic() - t0, 1),
    }
    ft._write_atomic(run.work / "dsa_warmup.json", json.dumps({"settings": settings, "summary": summary}, indent=1))
    run.finish()
    if json_out:
        print_json(summary)
        return
    line = f"[green]warmed up[/] the indexers of {model}"
    if kl_hist:
        line += f": KL to dense attention {summary['kl_first']:.4g} -> {summary['kl_last']:.4g}"
    if sparse_hist:
        line += f"; sparse LM loss {summary['sparse_loss_first']:.3f} -> {summary['sparse_loss_last']:.3f}"
    console.print(f"{line}, in {summary['seconds']:.0f}s; wrote {out}")
    console.print(f"serve it with: glm5 serve {out}")


class _StepLog:
    """OUT/train_log.jsonl, one line per step. A resumed run first drops the lines past its checkpoint (steps
    it will run again), so the log reads as one uninterrupted run."""

    def __init__(self, path: Path, state: dict | None):
        self.path = path
        keep = []
        if state is not None and path.is_file():
            at = (STAGES.index(state["stage"]), state["step"])
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # the line a kill -9 tore mid-write: its step runs again
                    continue
                if (STAGES.index(rec["stage"]), rec["step"]) <= at:
                    keep.append(line)
        path.write_text("".join(x + "\n" for x in keep))

    def write(self, rec: dict, info) -> None:
        rec |= {"tokens": info.loss.tokens, "seconds": round(info.seconds, 4)}
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")


def _load_indexer(net, indexer: dict) -> None:
    import torch

    params = dict(net.named_parameters())
    with torch.no_grad():
        for n, t in indexer.items():
            params[n].copy_(t)


def _tail_mean(xs: list[float], n: int = 10) -> float:
    return sum(xs[-n:]) / len(xs[-n:])


# ---- `glm5 finetune sft --qat int4` -------------------------------------------------------------------------


def qat_settings(qat: str | None, group_size: int, full: bool, merge: bool):
    """The QAT scheme of `--qat` / `--qat-group-size` (None without --qat); bad values are usage errors."""
    if qat is None:
        return None
    from finetune.qat import QAT_SCHEMES, QATSettings
    from model.int4_linear import GROUP_SIZES

    if qat not in QAT_SCHEMES:
        fail(f"--qat {qat!r} is not supported", code=EXIT_USAGE, hint=f"choose one of {', '.join(QAT_SCHEMES)}")
    if not (full or merge):
        fail(
            "--qat int4 with LoRA trains the merged weights for INT4: add --merge (or use --full)",
            code=EXIT_USAGE,
            hint="INT4 quantizes the checkpoint with the adapter merged in; an adapter alone is not what is served",
        )
    if group_size not in GROUP_SIZES:
        fail(f"--qat-group-size {group_size} is not supported", code=EXIT_USAGE, hint=f"choose one of {GROUP_SIZES}")
    return QATSettings(group_size=group_size)


def apply_qat(net, s) -> int:
    """Fake-quantized linears swapped in (finetune/qat.py). -> how many."""
    from finetune.qat import apply_qat as swap

    try:
        return len(swap(net, s))
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)


def write_qat_checkpoints(model: Path, net, work: Path, s, lora: bool) -> None:
    """WORK: the trained full-precision checkpoint (with LoRA: WORK/adapter, and the merge); WORK/int4: it in
    compressed-tensors INT4 with the trained scheme, which `glm5 serve WORK/int4` loads. The checkpoint is
    assembled in WORK/.checkpoint first: the INT4 writer copies every file beside the weights, and WORK also
    holds the run's own files (its data, the optimizer state)."""
    import os
    import shutil

    from finetune.lora import merge_lora, save_adapter
    from finetune.qat import remove_qat, write_int4_checkpoint
    from finetune.run_dir import write_checkpoint

    remove_qat(net)
    if lora:
        save_adapter(net, work / "adapter", base=str(model.resolve()))
        net = merge_lora(net)
    staging = work / ".checkpoint"
    for old in (staging, work / "int4"):  # what a run killed while writing left
        shutil.rmtree(old, ignore_errors=True)
    write_checkpoint(model, net, staging)
    with console.status("writing the INT4 checkpoint..."):
        write_int4_checkpoint(staging, work / "int4", s)
    for f in staging.iterdir():
        os.replace(f, work / f.name)
    staging.rmdir()
