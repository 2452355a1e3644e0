"""What `glm5 finetune distill` runs: teachers by domain, prompts by domain, the run's step log, and the recipe
itself (DistillRun).

    teachers = parse_teachers(["math=runs/stage-a", "base"])    # {"math": Path, "default": None (the base)}
    prompts = read_prompts([("math", Path("math.jsonl"))], tokenizer)
    models = {d: load_teacher(p) for d, p in teachers.items() if p is not None}

A teacher is a checkpoint directory, a LoRA adapter directory (`glm5 finetune sft`'s OUT/adapter: merged into
the base checkpoint it recorded) or `base` (the student with its adapter off: no model is loaded). Prompt files
are the JSONL that align-mtp and `glm5 finetune rl --tasks` read ({"prompt"} or {"messages"} a line; a task's
"reward" is ignored here: the teacher is the signal); a line's "domain" key overrides its file's. Knows nothing
of the command line: the helpers' errors are ValueError with the file (and line) in the message, the recipe's
finetune.errors' UsageError / RunError.

With --qlora the student is LoRA over its base frozen as stored (finetune/sharded_load.py) and teacher checkpoints
are loaded frozen the same way (`load_sharded_teacher`); under torchrun every rank holds its shards of each, and
train_distill runs its sampling and scoring in lock step across the ranks (finetune/distill.py); rank 0 writes
the log, the adapter (finetune/artifacts.write_qlora_adapter) and the summary; checkpoints are DCP's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.artifacts import write_adapter, write_atomic, write_checkpoint, write_qlora_adapter, write_record
from finetune.data.prompts import read_prompt_rows
from finetune.distill import DistillConfig, Prompt, Teacher, train_distill
from finetune.distributed import Distributed
from finetune.errors import UsageError
from finetune.full import FullSettings, prepare_full
from finetune.loading import check_qlora_merge, checkpoint_tokenizer, load_for_training, load_qlora
from finetune.lora import LoraSettings, add_lora, load_adapter, merge_lora
from finetune.recipe import Reporter, Run, tail_mean
from finetune.sharded_load import load_lora_sharded
from finetune.train_loop import OptimConfig
from model import GLM5ForCausalLM
from model.checkpoint import CheckpointError

BASE = "base"  # the teacher that is the student's own base (its LoRA adapter off)
DEFAULT_DOMAIN = "default"


def split_domain(spec: str) -> tuple[str, str]:
    """`DOMAIN=VALUE` -> (DOMAIN, VALUE); a plain `VALUE` is the default domain's. A path that itself holds '='
    can be given as `default=PATH`."""
    domain, sep, value = spec.partition("=")
    if not sep:
        return DEFAULT_DOMAIN, spec
    if not domain or not value:
        raise ValueError(f"{spec!r}: expected DOMAIN=VALUE or VALUE")
    return domain, value


def parse_teachers(specs: list[str]) -> dict[str, Path | None]:
    """`[DOMAIN=]CHECKPOINT|ADAPTER|base` each -> {domain: path, or None for the base}. One teacher a domain."""
    out: dict[str, Path | None] = {}
    for spec in specs:
        domain, value = split_domain(spec)
        if domain in out:
            raise ValueError(f"two teachers for domain {domain!r}: give each domain one --teacher")
        if value == BASE:
            out[domain] = None
            continue
        path = Path(value)
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ValueError(f"teacher {value}: not a checkpoint (no config.json) nor a LoRA adapter directory")
        out[domain] = path
    return out


def read_prompts(files: list[tuple[str, Path]], tokenizer) -> list[Prompt]:
    """(domain, JSONL path) pairs -> one Prompt a line, in file order; a line's "domain" overrides its file's."""
    prompts = []
    for domain, path in files:
        try:
            rows = read_prompt_rows(path, tokenizer)
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
        for ids, row, where in rows:
            d = row.get("domain", domain)
            if not isinstance(d, str) or not d:
                raise ValueError(f'{where}: "domain" must be a non-empty string')
            prompts.append(Prompt(ids, d))
    return prompts


def check_domains(prompts: list[Prompt], teachers: dict[str, Path | None]) -> None:
    """Every prompt's domain has a teacher and every teacher has prompts (an unused one is most likely a typo)."""
    have = {p.domain for p in prompts}
    if missing := sorted(have - set(teachers)):
        raise ValueError(
            f"no teacher for the prompts of domain(s) {missing}: add --teacher DOMAIN=CKPT (or DOMAIN=base) for each"
        )
    if unused := sorted(set(teachers) - have):
        raise ValueError(f"no prompts for the teacher(s) of domain(s) {unused} (prompt domains: {sorted(have)})")


def load_teacher(path: Path, student_config):
    """A teacher checkpoint (or adapter, merged into the base it recorded), frozen, in fp32. Its vocabulary must
    be the student's: the teacher scores the student's token ids."""
    adapter = None
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        adapter = path
        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise ValueError(f"teacher {path}: the adapter's base checkpoint {base!r} is not there")
        path = Path(base)
    net = GLM5ForCausalLM.from_pretrained(path, dtype=torch.float32)
    if (net.config.quantization_config or {}).get("quant_method") == "compressed-tensors":
        raise ValueError(f"teacher {path} holds INT4 weights: give its full-precision checkpoint")
    if adapter is not None:
        net = merge_lora(load_adapter(net, adapter))
    if net.config.vocab_size != student_config.vocab_size:
        raise ValueError(
            f"teacher {adapter or path} has a vocabulary of {net.config.vocab_size} tokens, the student "
            f"{student_config.vocab_size}: a teacher must share the student's tokenizer"
        )
    return net


def load_sharded_teacher(path: Path, student_config, dist):
    """A teacher checkpoint frozen as stored (FP8, INT4 or bf16), never whole in one process: under torchrun each
    rank holds its shards (finetune/sharded_load.py, no adapter). An adapter teacher is merged on load, which needs
    the whole base: with --qlora give the merged checkpoint."""
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        raise ValueError(f"teacher {path} is a LoRA adapter: with --qlora a teacher is a checkpoint (or `base`); "
                         "write the adapter merged (`--merge`) and give that checkpoint")  # fmt: skip
    net, _ = load_lora_sharded(path, None, dist)
    if net.config.vocab_size != student_config.vocab_size:
        raise ValueError(f"teacher {path} has a vocabulary of {net.config.vocab_size} tokens, the student "
                         f"{student_config.vocab_size}: a teacher must share the student's tokenizer")  # fmt: skip
    return net


class StepLog:
    """OUT/train_log.jsonl: one line per step (step, reverse KL estimate, lr, tokens, seconds). A resumed run
    first drops the lines past its checkpoint, so the log is the run's, not the interrupted run's plus."""

    def __init__(self, path: Path, resume_step: int = 0):
        self.path = path
        lines = path.read_text().splitlines() if path.is_file() and resume_step else []
        kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= resume_step]
        write_atomic(path, "".join(ln + "\n" for ln in kept))

    def write(self, info) -> None:
        row = {"step": info.step, "reverse_kl": round(info.loss.lm, 5), "lr": info.lr, "tokens": info.loss.tokens}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row | {"seconds": round(info.seconds, 3)}) + "\n")


@dataclass(frozen=True)
class DistillJob:
    """`glm5 finetune distill`'s options, parsed (see its --help for each)."""

    student: Path
    out: Path
    teachers: list[str]  # [DOMAIN=]TEACHER specs
    prompt_files: list[str]  # [DOMAIN=]FILE specs, --prompts then --tasks
    steps: int = 100
    prompts_per_step: int = 8
    max_new_tokens: int = 256
    temperature: float = 1.0
    kl: str = "full"
    lr: float = 1e-3
    rank: int = 16
    alpha: int = 32
    full: bool = False
    merge: bool = False
    seed: int = 0
    save_every: int = 10
    qlora: bool = False  # the student's base frozen as stored, never whole in one process; under torchrun sharded


class DistillRun:
    """The recipe of `glm5 finetune distill` (moved from glm5cli/distill_cmd.py): the teachers, the run folder
    and the prompts at construction (`longest`: the longest prompt plus its completion, for the memory plan),
    then `run()`: the student and the teachers loaded, train_distill, OUT written -> the summary."""

    def __init__(self, job: DistillJob, reporter: Reporter):
        self.job, self.rep = job, reporter
        self.dist = Distributed.from_env()  # under torchrun
        if self.dist is not None and not job.qlora:
            raise UsageError("under torchrun, distillation shards the student's frozen base: add --qlora")
        if job.qlora and job.full:
            raise UsageError("--qlora trains a LoRA adapter over the frozen base: not with --full")
        if job.qlora:
            check_qlora_merge(job.student, job.merge)
        if self.dist is not None:
            self.dist.init()
        self.main = self.dist is None or self.dist.is_main
        try:
            self.teachers = parse_teachers(job.teachers)
            files = [(d, Path(f)) for d, f in map(split_domain, job.prompt_files)]
        except ValueError as e:
            raise UsageError(str(e)) from None
        if job.full and None in self.teachers.values():
            raise UsageError("teacher `base` is the student with its adapter off, and --full trains no adapter",
                             "drop --full, or give that domain the student's checkpoint as its teacher")  # fmt: skip
        tok = checkpoint_tokenizer(job.student)
        self.settings = run_settings(job, self.teachers, files)
        self.run_dir = Run(job.out, self.settings, reporter=reporter)
        saved = self.run_dir.saved_sequences()
        try:
            if saved is not None:
                self.prompts = [Prompt(ids, d) for ids, d in saved["prompts"]]
            else:
                self.prompts = read_prompts(files, tok)
            check_domains(self.prompts, self.teachers)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.longest = max((len(p.ids) for p in self.prompts), default=0) + job.max_new_tokens

    def run(self) -> dict | None:
        """Train and write OUT -> the summary (None on a torchrun rank other than 0)."""
        job, run, chosen = self.job, self.run_dir, self.prompts
        t0 = time.monotonic()
        net, named = self._student()
        limit = net.config.max_position_embeddings
        if too_long := [i for i, p in enumerate(chosen) if len(p.ids) + job.max_new_tokens > limit]:
            raise UsageError(f"{len(too_long)} prompt(s) + --max-new-tokens exceed the student's context ({limit})")
        models = self._teachers(net.config)
        data = {"prompts": [[p.ids, p.domain] for p in chosen]}
        state = run.start_resumable(data, named, self.dist) if job.qlora else run.start(data)
        by_domain = {d: sum(p.domain == d for p in chosen) for d in self.teachers}
        if self.main:
            self.rep.say(f"distilling on {len(chosen)} prompts: " + ", ".join(
                f"{n} {d} (teacher {self.settings['teachers'][d]})" for d, n in by_domain.items()))  # fmt: skip
        hist, tokens_per_s = self._train(net, models, named, state)
        if job.qlora:
            write_qlora_adapter(job.student, net, run.work, job.merge, self.dist, self.rep.status)
            if self.dist is not None:
                self.dist.close()
            if not self.main:
                return None
        elif job.full:
            write_checkpoint(job.student, net, run.work)
        else:
            write_adapter(job.student, net, run.work, job.merge, status=self.rep.status)
        summary = self._summary(by_domain, hist, tokens_per_s, t0)
        # RunDir.finish drops its resume files (run.json among them); the record of the run stays in OUT.
        write_record(run.work / "distill_run.json", self.settings, summary)
        run.finish()
        return summary

    def _student(self):
        """-> (the student with its adapter, or whole with --full; its trained parameters by name)."""
        job = self.job
        settings = LoraSettings(rank=job.rank, alpha=job.alpha)
        if job.qlora:  # the base frozen as stored, this rank's shards only
            return load_qlora(job.student, settings, self.dist, job.seed, self.rep.status)
        net = load_for_training(job.student, "distil into the full-precision checkpoint", self.rep.status)
        if job.full:
            return net, prepare_full(net, FullSettings())
        net = add_lora(net, settings, seed=job.seed)
        return net, [(n, p) for n, p in net.named_parameters() if p.requires_grad]

    def _teachers(self, student_config) -> dict[str, Teacher]:
        models = {}
        with self.rep.status("loading the teachers..."):
            for d, p in self.teachers.items():
                try:
                    if p is None:
                        models[d] = Teacher.base()
                    elif self.job.qlora:
                        models[d] = Teacher.checkpoint(load_sharded_teacher(p, student_config, self.dist))
                    else:
                        models[d] = Teacher.checkpoint(load_teacher(p, student_config))
                except (CheckpointError, ValueError) as e:
                    raise UsageError(str(e)) from None
        return models

    def _train(self, net, models: dict, named, state) -> tuple[list, float | None]:
        job, run = self.job, self.run_dir
        log = StepLog(run.work / "train_log.jsonl", state["step"] if state else 0) if self.main else None
        eos = net.config.eos_token_id
        stop = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        cfg = DistillConfig(OptimConfig(steps=job.steps, lr=job.lr, warmup=max(1, job.steps // 20)),
                            prompts_per_step=job.prompts_per_step, max_new_tokens=job.max_new_tokens,
                            temperature=job.temperature, kl=job.kl, seed=job.seed)  # fmt: skip
        title = "distilling (full)" if job.full else "distilling (LoRA)"
        with self.rep.training(title, job.steps, state, quiet=not self.main) as bar:

            def on_step(info) -> None:
                bar.on_step(info)
                if log is not None:
                    log.write(info)

            loop = run.loop_args(state, job.save_every, bar, named, self.dist) | {"on_step": on_step}
            try:
                hist = train_distill(net, self.prompts, models, cfg, stop=stop, named=named, dist=self.dist, **loop)
            except ValueError as e:  # a token outside the vocabulary
                raise UsageError(str(e)) from None
        return hist, bar.tokens_per_s

    def _summary(self, by_domain: dict, hist: list, tokens_per_s, t0: float) -> dict:
        job = self.job
        return {
            "out": str(job.out),
            "adapter": None if job.full else str(job.out / "adapter"),
            "checkpoint": str(job.out) if job.merge or job.full else None,
            "prompts": by_domain,
            "steps": job.steps,
            "kl": job.kl,
            "reverse_kl_first": round(hist[0].lm, 4),
            "reverse_kl_last": round(tail_mean([h.lm for h in hist]), 4),
            # with either --kl, what is logged is the sampled estimate, not the full sum the loss may use
            "reverse_kl_is": "the mean log-ratio student/teacher at the sampled tokens (an estimate; can be negative)",
            "tokens_per_s": tokens_per_s,
            "seconds": round(time.monotonic() - t0, 1),
        }


def run_settings(job: DistillJob, teachers: dict[str, Path | None], files: list[tuple[str, Path]]) -> dict:
    settings = {
        "student": str(job.student.resolve()),
        "teachers": {d: str(p.resolve()) if p else "base" for d, p in teachers.items()},
        "prompt_files": [[d, str(f.resolve())] for d, f in files],
        "steps": job.steps,
        "prompts_per_step": job.prompts_per_step,
        "max_new_tokens": job.max_new_tokens,
        "temperature": job.temperature,
        "kl": job.kl,
        "lr": job.lr,
        "seed": job.seed,
        "full": job.full,
    }
    settings |= {"qlora": True} if job.qlora else {}
    return settings | ({} if job.full else {"rank": job.rank, "alpha": job.alpha, "merge": job.merge})
