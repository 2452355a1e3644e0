"""The recipe of `glm5 finetune sft`: everything it does once its options are parsed.

    job = SFTJob(model, out, data, steps=200, lr=2e-4, ...)
    sft = SFTRun(job, reporter)          # joins torchrun's process group (if any), checks the flags
    summary = sft.run()                  # None on a torchrun rank other than 0

The life of a run: the run folder opens (or resumes: finetune/recipe.py) -> the data is read (or the saved data
of the interrupted run) -> the model is built: LoRA over the fp32 checkpoint, --full's trained parameters, or
--qlora's base frozen as stored and loaded by shards (finetune/sharded_load.py) -> --qat swaps in fake-quantized
linears (finetune/qat.py) -> under torchrun FSDP2 shards it (finetune/distributed.py) -> sft.train_sft runs
the loop, checkpointing into the run folder -> finetune/artifacts.py writes the adapter, the checkpoint or the
INT4 checkpoint, and the train log -> the folder is renamed to OUT. Every refusal is a finetune.errors error.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from finetune.artifacts import (
    write_adapter,
    write_checkpoint,
    write_qat_checkpoints,
    write_qlora_adapter,
    write_sharded,
    write_train_log,
)
from finetune.data.trajectories import DataOptions
from finetune.distributed import Distributed
from finetune.dsa_warmup import dense_attention as all_keys
from finetune.errors import RunError, UsageError
from finetune.full import FullSettings, prepare_full
from finetune.loading import (
    check_qlora_merge,
    checkpoint_tokenizer,
    filtered_hint,
    load_data,
    load_for_training,
    load_qlora,
)
from finetune.lora import LoraSettings, add_lora, weights_fingerprint
from finetune.qat import QAT_SCHEMES, QATSettings
from finetune.qat import apply_qat as swap_qat
from finetune.recipe import Reporter, Run, tail_mean
from finetune.sft import SFTConfig, train_sft
from finetune.train_loop import OptimConfig
from model.int4_linear import GROUP_SIZES

FULL_PRECISION = "fine-tune the full-precision checkpoint"


@dataclass(frozen=True)
class SFTJob:
    """`glm5 finetune sft`'s options, parsed (see its --help for each)."""

    model: Path
    out: Path
    data: list[Path]
    opts: DataOptions
    steps: int = 200
    lr: float = 2e-4
    rank: int = 16
    alpha: int = 32
    batch_size: int = 4
    max_len: int = 4096
    seed: int = 0
    pack: bool = False
    micro_batch: int = 0
    full: bool = False
    train_mtp: bool = False
    mtp_steps: int = 3
    router_bias_rate: float = 0.0
    qat: str | None = None
    qat_group_size: int = 128
    save_every: int = 50
    dense_attention: bool = False
    merge: bool = False
    qlora: bool = False
    offload_optimizer: bool = False


def qat_scheme(qat: str | None, group_size: int, full: bool, merge: bool) -> QATSettings | None:
    """The QAT scheme of `--qat` / `--qat-group-size` (None without --qat); bad values are usage errors.
    (Moved from glm5cli/stages_cmd.py's qat_settings.)"""
    if qat is None:
        return None
    if qat not in QAT_SCHEMES:
        raise UsageError(f"--qat {qat!r} is not supported", f"choose one of {', '.join(QAT_SCHEMES)}")
    if not (full or merge):
        raise UsageError(
            "--qat int4 with LoRA trains the merged weights for INT4: add --merge (or use --full)",
            "INT4 quantizes the checkpoint with the adapter merged in; an adapter alone is not what is served",
        )
    if group_size not in GROUP_SIZES:
        raise UsageError(f"--qat-group-size {group_size} is not supported", f"choose one of {GROUP_SIZES}")
    return QATSettings(group_size=group_size)


def check_qlora_flags(model: Path, full: bool, qat, merge: bool, train_mtp: bool) -> None:
    """What --qlora cannot combine with, as usage errors before anything is read. (Moved from
    glm5cli/qlora_run.py's check_flags.)"""
    if full or qat is not None or train_mtp:
        raise UsageError("--qlora trains a LoRA adapter over the frozen base: not with --full, --qat or --train-mtp")
    check_qlora_merge(model, merge)


def run_settings(job: SFTJob) -> dict:
    """run.json's settings of the job (a rerun resumes only with the same), without --merge."""
    settings = {"model": str(job.model.resolve()), "data": [str(p.resolve()) for p in job.data], "steps": job.steps}
    settings |= {"lr": job.lr, "rank": job.rank, "alpha": job.alpha, "batch_size": job.batch_size,
                 "max_len": job.max_len, "seed": job.seed}  # fmt: skip
    settings |= {"data_options": job.opts.__dict__, "pack": job.pack, "micro_batch": job.micro_batch}
    if job.dense_attention:
        settings |= {"dense_attention": True}
    if job.full:
        settings |= {"full": True, "train_mtp": job.train_mtp, "router_bias_rate": job.router_bias_rate}
        if job.train_mtp:
            settings |= {"mtp_steps": job.mtp_steps}
    elif job.train_mtp or job.router_bias_rate:
        raise UsageError("--train-mtp and --router-bias-rate apply to --full fine-tuning")
    return settings


class SFTRun:
    """One `glm5 finetune sft`: the checks at construction (the flags, the checkpoint's tokenizer), `data()` for
    --export-slime, `run()` for the training."""

    def __init__(self, job: SFTJob, reporter: Reporter):
        self.job, self.rep = job, reporter
        self.dist = Distributed.from_env()  # under torchrun
        if self.dist is not None:
            self.dist.init()
        self.main = self.dist is None or self.dist.is_main
        self.tok = checkpoint_tokenizer(job.model)
        self.settings = run_settings(job)
        self.qat = qat_scheme(job.qat, job.qat_group_size, job.full, job.merge)
        if self.qat is not None and self.dist is not None:
            raise UsageError("--qat is not supported under torchrun yet: run it as one process")
        if self.qat is not None:
            self.settings |= {"qat": job.qat, "qat_group_size": job.qat_group_size}
        if job.qlora:
            check_qlora_flags(job.model, job.full, job.qat, job.merge, job.train_mtp)
            self.settings |= {"qlora": True}

    def data(self) -> tuple[list, dict]:
        """The sequences (ids, target mask) the run trains on, and the data report."""
        return load_data(self.job.data, self.tok, self.job.opts)

    def run(self) -> dict | None:
        """Train and write OUT -> the summary (None on a torchrun rank other than 0)."""
        job, dist = self.job, self.dist
        run = Run(job.out, self.settings | {"merge": job.merge}, added={"data_options.allow_foreign": False},
                  reporter=self.rep)  # fmt: skip
        saved = run.saved_sequences()
        if saved is not None:
            seqs, report = [(s, [bool(x) for x in m]) for s, m in saved["sequences"]], saved["report"]
        else:
            seqs, report = self.data()
        if not seqs:
            raise RunError("no responses to train on: the data holds no model turns to learn from",
                           filtered_hint(report))  # fmt: skip
        if dist is not None:
            dist.barrier()  # every rank has read the run folder before rank 0 writes to it
        t0 = time.monotonic()
        net, named, fingerprint = self._model()
        qat_linears = self._apply_qat(net)
        if dist is not None and not job.qlora:
            if not job.full:
                fingerprint = weights_fingerprint(net)  # of the whole base, before it is sharded
            named = dist.shard(net, named)
        data = {"sequences": [[s, [int(x) for x in m]] for s, m in seqs], "report": report}
        state = run.start_resumable(data, named, dist)
        if self.main:
            self.rep.data(report)
        hist, tokens_per_s = self._train(net, named, seqs, state, run)
        if not self._write(net, run.work, fingerprint):
            return None
        write_train_log(run.work, hist)
        summary = self._summary(seqs, hist, tokens_per_s, report, t0)
        if self.qat is not None:
            summary |= {"int4_checkpoint": str(job.out / "int4"), "qat_linears": qat_linears}
        run.finish()
        return summary

    def _model(self):
        """-> (the model to train, its trained parameters by name, MODEL's weights fingerprint or None)."""
        job = self.job
        if job.qlora:  # the base frozen as stored, never whole in one process
            return (*self._load_qlora(), None)
        net = load_for_training(job.model, FULL_PRECISION, self.rep.status)
        if job.full:
            return net, prepare_full(net, FullSettings(train_mtp=job.train_mtp,
                                                       router_bias_rate=job.router_bias_rate)), None  # fmt: skip
        net = add_lora(net, LoraSettings(rank=job.rank, alpha=job.alpha), seed=job.seed)
        return net, [(n, p) for n, p in net.named_parameters() if p.requires_grad], None

    def _load_qlora(self):
        """-> (the model with LoRA, its trainable parameters); a checkpoint that does not fit is a RunError.
        (Moved from glm5cli/qlora_run.py's load.)"""
        job = self.job
        return load_qlora(job.model, LoraSettings(rank=job.rank, alpha=job.alpha), self.dist, job.seed, self.rep.status)

    def _apply_qat(self, net) -> int:
        """Fake-quantized linears swapped in (finetune/qat.py) -> how many (0 without --qat)."""
        if self.qat is None:
            return 0
        try:
            return len(swap_qat(net, self.qat))
        except ValueError as e:
            raise UsageError(str(e)) from None

    def _train(self, net, named, seqs, state, run) -> tuple[list, float | None]:
        """train_sft over the run folder -> (the loss history, tokens/s)."""
        job = self.job
        cfg = SFTConfig(OptimConfig(steps=job.steps, lr=job.lr, warmup=max(1, job.steps // 20),
                                    offload=job.offload_optimizer),
                        batch_size=job.batch_size, seed=job.seed, micro_batch=job.micro_batch, pack=job.pack,
                        pack_len=job.max_len, mtp_steps=job.mtp_steps if job.train_mtp else 0)  # fmt: skip
        extra = {"named": named, "router_bias_rate": job.router_bias_rate, "dist": self.dist}
        title = "fine-tuning (full)" if job.full else "fine-tuning (LoRA)"
        with (
            self.rep.training(title, job.steps, state, quiet=not self.main) as bar,
            all_keys(net) if job.dense_attention else nullcontext(),
        ):
            hist = train_sft(net, seqs, cfg, **run.loop_args(state, job.save_every, bar, named, self.dist), **extra)
        return hist, bar.tokens_per_s

    def _write(self, net, work: Path, fingerprint: str | None) -> bool:
        """The adapter / checkpoint(s) into WORK -> whether this process goes on (rank 0, or the one process)."""
        job, dist, status = self.job, self.dist, self.rep.status
        if job.qlora:
            write_qlora_adapter(job.model, net, work, job.merge, dist, status)
        elif dist is not None:
            write_sharded(job.model, net, work, job.full, job.merge, dist, fingerprint, status)
        if dist is not None:
            dist.close()
            return self.main
        if job.qlora:
            pass  # written above, by the one process
        elif self.qat is not None:
            write_qat_checkpoints(job.model, net, work, self.qat, lora=not job.full, status=status)
        elif job.full:
            write_checkpoint(job.model, net, work)
        else:
            write_adapter(job.model, net, work, job.merge, status=status)
        return True

    def _summary(self, seqs, hist, tokens_per_s, report: dict, t0: float) -> dict:
        job = self.job
        merged = job.merge or job.full
        return {
            "out": str(job.out),
            "adapter": None if job.full else str(job.out / "adapter"),
            "adapter_hf": None if job.full else str(job.out / "adapter_hf"),  # for peft + transformers
            "merged_checkpoint": str(job.out) if merged else None,
            "examples": len(seqs),
            "trained_tokens": sum(sum(m) for _, m in seqs),
            "steps": job.steps,
            "loss_first": round(hist[0].lm, 4),
            "loss_last": round(tail_mean([h.lm for h in hist]), 4),
            "mtp_loss_last": round(tail_mean([h.mtp_mean for h in hist]), 4) if job.train_mtp else None,
            "tokens_per_s": tokens_per_s,
            "seconds": round(time.monotonic() - t0, 1),
            "data": report,
        }
