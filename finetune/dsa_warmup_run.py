"""The recipe of `glm5 finetune dsa-warmup`: the two stages of finetune/dsa_warmup.py run as one resumable job
(moved from glm5cli/stages_cmd.py).

    summary = run_dsa_warmup(DSAJob(model, out, data, warmup_steps=100, sparse_steps=50), reporter)

The resume state machine: a checkpoint's "stage" says where a killed run was, in run order
    warmup       the dense warm-up's training state (indexers only)   -> resume the warm-up at its step
    warmup_done  the warmed-up indexers, between the stages            -> load them, start the sparse stage
    sparse       the sparse stage's training state (+ the warm-up's KL history and the MTP layer's indexer)
so a run killed anywhere continues where it was, and train_log.jsonl reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.artifacts import write_checkpoint, write_record
from finetune.data.trajectories import DataOptions
from finetune.dsa_warmup import (
    DSAWarmupConfig,
    indexer_layers,
    indexer_parameters,
    train_dense_warmup,
    train_sparse,
)
from finetune.errors import RunError
from finetune.loading import checkpoint_tokenizer, filtered_hint, load_data, load_for_training
from finetune.recipe import Reporter, tail_mean
from finetune.resume_state import check_dsa_state
from finetune.run_dir import RunDir

STAGES = ("warmup", "warmup_done", "sparse")  # what a checkpoint's "stage" says, in run order


@dataclass(frozen=True)
class DSAJob:
    """`glm5 finetune dsa-warmup`'s options, parsed (see its --help for each)."""

    model: Path
    out: Path
    data: list[Path]
    warmup_steps: int = 100
    lr: float = 1e-3
    sparse_steps: int = 0
    sparse_lr: float = 1e-5
    batch_size: int = 4
    max_len: int = 2048
    seed: int = 0
    save_every: int = 50


class StepLog:
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


def load_indexer(net, indexer: dict) -> None:
    """The saved indexer tensors (by parameter name) copied into `net`."""
    params = dict(net.named_parameters())
    with torch.no_grad():
        for n, t in indexer.items():
            params[n].copy_(t)


def run_settings(job: DSAJob) -> dict:
    settings = {"command": "dsa-warmup", "model": str(job.model.resolve()), "data": [str(p.resolve()) for p in job.data]}
    settings |= {"warmup_steps": job.warmup_steps, "lr": job.lr, "sparse_steps": job.sparse_steps,
                 "sparse_lr": job.sparse_lr}  # fmt: skip
    settings |= {"batch_size": job.batch_size, "max_len": job.max_len, "seed": job.seed}
    return settings


class DSAWarmupRun:
    """One `glm5 finetune dsa-warmup`: `run()` trains the stages the run has left and writes OUT."""

    def __init__(self, job: DSAJob, reporter: Reporter):
        self.job, self.rep = job, reporter
        self.cfg = DSAWarmupConfig(job.warmup_steps, job.lr, job.sparse_steps, job.sparse_lr, job.batch_size, job.seed)
        self.kl_hist: list[float] = []
        self.tps: list[float] = []

    def run(self) -> dict:
        """-> the summary."""
        job = self.job
        tok = checkpoint_tokenizer(job.model)
        settings = run_settings(job)
        run = RunDir(job.out, settings)
        saved = run.saved_sequences()
        if saved is not None:
            seqs, report = [(s, [bool(x) for x in m]) for s, m in saved["sequences"]], saved["report"]
        else:
            seqs, report = load_data(job.data, tok, DataOptions(max_len=job.max_len))
        if not seqs:
            raise RunError("no sequences to train on", filtered_hint(report))
        t0 = time.monotonic()
        net = load_for_training(job.model, "run the warm-up on the full-precision checkpoint, then quantize the "
                                "result", self.rep.status)  # fmt: skip
        if not indexer_layers(net):
            raise RunError(f"{job.model} has no DSA indexer (no layer with its own indexer): nothing to warm up")
        state = run.start(
            {"sequences": [[s, [int(x) for x in m]] for s, m in seqs], "report": report}, check=check_dsa_state
        )
        stage = state["stage"] if state else "warmup"
        if state:
            self.rep.say(f"resuming {run.work} at the {stage} stage, step {state['step']}")
        log = StepLog(run.work / "train_log.jsonl", state)
        self.rep.data(report)
        self.kl_hist = state.get("warmup_kl", []) if state else []
        if stage == "warmup" and job.warmup_steps:
            self._warmup(net, seqs, state, run, log)
            state = None
        elif stage == "warmup_done":
            load_indexer(net, state["indexer"])
            state = None
        sparse_hist = self._sparse(net, seqs, state, run, log) if job.sparse_steps else []
        write_checkpoint(job.model, net, run.work)
        summary = self._summary(len(seqs), sparse_hist, t0)
        write_record(run.work / "dsa_warmup.json", settings, summary)
        run.finish()
        return summary

    def _warmup(self, net, seqs, state, run: RunDir, log: StepLog) -> None:
        """The dense warm-up; with a sparse stage to come, its result saved as the "warmup_done" state."""
        job = self.job
        with self.rep.training("warm-up (indexer KL)", job.warmup_steps, state) as bar:

            def warm_step(info) -> None:
                bar.on_step(info)
                log.write({"stage": "warmup", "step": info.step, "kl": info.loss.lm, "lr": info.lr}, info)

            hist = train_dense_warmup(net, seqs, self.cfg, resume=state, save=lambda st: run.save(st | {"stage": "warmup"}),
                                      save_every=job.save_every, on_step=warm_step)  # fmt: skip
        self.kl_hist = [h.lm for h in hist]
        self.tps.append(bar.tokens_per_s or 0.0)
        if job.sparse_steps:  # the warm-up's result, so that a kill during the sparse stage does not redo it
            indexer = {n: p.detach().clone() for n, p in indexer_parameters(net, mtp=True)}
            run.save({"stage": "warmup_done", "step": job.warmup_steps, "indexer": indexer, "warmup_kl": self.kl_hist})

    def _sparse(self, net, seqs, state, run: RunDir, log: StepLog) -> list:
        """The sparse stage -> its loss history."""
        job = self.job
        # the sparse stage does not train the MTP layer's indexer: its warmed-up values ride along in every
        # checkpoint, so a run resumed here does not serve the MTP layer with its initial indexer
        main_ix = {n for n, _ in indexer_parameters(net)}
        if state and state.get("stage") == "sparse":
            load_indexer(net, state.get("mtp_indexer", {}))
        mtp_ix = {n: p.detach().clone() for n, p in indexer_parameters(net, mtp=True) if n not in main_ix}
        kl_hist = self.kl_hist
        with self.rep.training("sparse training (LM)", job.sparse_steps, state) as bar:

            def sparse_step(info) -> None:
                kl = info.loss.mtp[0]
                info.loss.mtp = []  # the bar's "mtp" column would mislabel the indexer's KL
                bar.on_step(info)
                info.loss.mtp = [kl]
                log.write({"stage": "sparse", "step": info.step, "lm": info.loss.lm, "kl": kl, "lr": info.lr}, info)

            hist = train_sparse(
                net,
                seqs,
                self.cfg,
                resume=state,
                save=lambda st: run.save(st | {"stage": "sparse", "warmup_kl": kl_hist, "mtp_indexer": mtp_ix}),
                save_every=job.save_every,
                on_step=sparse_step,
            )
        self.tps.append(bar.tokens_per_s or 0.0)
        return hist

    def _summary(self, n_seqs: int, sparse_hist: list, t0: float) -> dict:
        kl_hist, tps = self.kl_hist, self.tps
        return {
            "out": str(self.job.out),
            "sequences": n_seqs,
            "warmup_steps": self.job.warmup_steps,
            "kl_first": round(kl_hist[0], 6) if kl_hist else None,
            "kl_last": round(tail_mean(kl_hist), 6) if kl_hist else None,
            "sparse_steps": self.job.sparse_steps,
            "sparse_loss_first": round(sparse_hist[0].lm, 4) if sparse_hist else None,
            "sparse_loss_last": round(tail_mean([h.lm for h in sparse_hist]), 4) if sparse_hist else None,
            "sparse_kl_last": round(tail_mean([h.mtp[0] for h in sparse_hist]), 6) if sparse_hist else None,
            "tokens_per_s": round(min(tps), 1) if tps else None,
            "seconds": round(time.monotonic() - t0, 1),
        }
