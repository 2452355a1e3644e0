"""`glm5 finetune`: `sft` (LoRA on recorded responses), `rl` (GRPO on tasks with checkable rewards) and
`align-mtp` (the MTP layer on the model's own output)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import typer

from glm5cli import qlora_run
from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json
from glm5cli.distill_cmd import distill as distill_command
from glm5cli.help_format import WholeSummaries
from glm5cli.plan_cmd import plan_cmd as plan_command
from glm5cli.plan_cmd import preflight
from glm5cli.rl_cmd import rl as rl_command
from glm5cli.stages_cmd import apply_qat, dsa_warmup, qat_settings, write_qat_checkpoints

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
    tok = _checkpoint_tokenizer(model)
    files = _trajectory_files(trajectories)
    run = _Run(
        out,
        {
            "model": str(model.resolve()),
            "trajectories": [str(f.resolve()) for f in files],
            "prompts": str(prompts.resolve()) if prompts else None,
            "max_new_tokens": max_new_tokens,
            "steps": steps,
            "lr": lr,
            "batch_size": batch_size,
            "max_len": max_len,
            "seed": seed,
        },
    )

    from finetune.data.trajectories import truncated
    from finetune.mtp_align import align_mtp, default_draft_vocab_size, draft_vocab, generate_sequences
    from finetune.mtp_objective import MTPTrainConfig
    from serve.engine.spec_decode import write_draft_vocab

    seqs: list[tuple[list[int], int]] = []
    prompt_ids: list[list[int]] = []
    saved = run.saved_sequences()
    if saved is not None:
        seqs, n_recorded = [(s, p) for s, p in saved["sequences"]], saved["from_trajectories"]
    else:
        seqs = _recorded_sequences(files, tok)
        n_recorded = len(seqs)
        if prompts is not None:
            prompt_ids = [ids for ids, _, _ in _prompt_rows(prompts, tok)]

    t0 = time.monotonic()
    net = _load_for_training(model, "align the full-precision checkpoint, then `glm5 model quantize` the result")
    if net.config.num_nextn_predict_layers < 1:
        fail(f"{model} has no MTP layer to align (num_nextn_predict_layers is 0)")
    with _progress() as bar:
        if prompt_ids:
            task = bar.add_task("generating", total=len(prompt_ids))
            try:
                seqs += generate_sequences(
                    net, prompt_ids, max_new_tokens, progress=lambda done, _: bar.update(task, completed=done)
                )
            except ValueError as e:  # a prompt too long for the context, a token outside the vocabulary
                fail(f"{prompts}: {e}", code=EXIT_USAGE)
    seqs = truncated(seqs, max_len)
    if not any(len(s) > p for s, p in seqs):
        fail("no model output to train on (the trajectories hold no assistant responses)")
    state = run.start({"sequences": seqs, "from_trajectories": n_recorded})
    cfg = MTPTrainConfig(steps=steps, lr=lr, warmup=max(1, steps // 20), train_main=False)
    with _TrainProgress("aligning the MTP layer", steps, state) as tbar:
        hist = align_mtp(net, seqs, cfg, batch_size=batch_size, seed=seed, **run.loop_args(state, save_every, tbar))
    vocab = None
    if draft_vocab_size != 0:
        size = draft_vocab_size or default_draft_vocab_size(seqs, net.config.vocab_size)
        # Past the tokens the model produced: the tokens of the prompts, then the lowest ids (BPE merge order,
        # roughly how common a token is).
        rest = [t for s, p in seqs for t in s[:p]] + list(range(net.config.vocab_size))
        vocab = draft_vocab(seqs, size=min(size, net.config.vocab_size), fallback=rest)
    # The checkpoint is assembled in the work directory and renamed into place: OUT is complete or absent.
    tmp = run.work
    _write_checkpoint(model, net, tmp)
    summary = {
        "out": str(out),
        "sequences": len(seqs),
        "from_trajectories": n_recorded,
        "from_prompts": len(seqs) - n_recorded,
        "trained_tokens": sum(len(s) - p for s, p in seqs),
        "steps": steps,
        "mtp_loss_first": round(hist[0].mtp_mean, 4),
        "mtp_loss_last": round(sum(h.mtp_mean for h in hist[-10:]) / len(hist[-10:]), 4),
        "draft_vocab": str(out / "draft_vocab.json") if vocab else None,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if vocab:
        write_draft_vocab(tmp / "draft_vocab.json", vocab, source=f"glm5 finetune align-mtp {model}")
    run.finish()
    if json_out:
        print_json(summary)
        return
    console.print(
        f"[green]aligned[/] the MTP layer of {model} on {summary['sequences']} sequences "
        f"({summary['trained_tokens']:,} model tokens), MTP loss {summary['mtp_loss_first']:.3f} -> "
        f"{summary['mtp_loss_last']:.3f}, in {summary['seconds']:.0f}s; wrote {out}"
    )
    serve = f"glm5 serve {out} --speculative mtp" + (f" --draft-vocab {out / 'draft_vocab.json'}" if vocab else "")
    console.print(f"serve it with: {serve}")


class _Run:
    """finetune.run_dir.RunDir for a command: a run that cannot start is a failure with its hint, a resumed one
    says so on stderr."""

    def __init__(self, out: Path, settings: dict, added: dict | None = None):
        from finetune.run_dir import RunDir, RunError

        try:
            self._dir = RunDir(out, settings, added)
        except RunError as e:
            fail(str(e), hint=e.hint)
        self.out, self.settings, self.work = out, settings, self._dir.work

    def saved_sequences(self) -> dict | None:
        return self._dir.saved_sequences()

    def start(self, data: dict) -> dict | None:
        state = self._dir.start(data)
        if state is not None:
            err_console.print(f"resuming {self.work} from step {state['step']} of {self.settings['steps']}")
        return state

    def start_resumable(self, data: dict, named, dist) -> dict | None:
        """`start` for a run whose last checkpoint may be a torchrun run's (DCP) or a single process's
        (state.pt), resumed at this run's world size (finetune/dist_checkpoint.py); only rank 0 writes."""
        from finetune.dist_checkpoint import load_resume

        if dist is None or dist.is_main:
            self._dir.start(data, load=False)
        if dist is not None:
            dist.barrier()
        try:
            state = load_resume(self.work, named, dist)
        except ValueError as e:
            fail(str(e), hint=f"delete {self.work} to start over")
        if state is not None and (dist is None or dist.is_main):
            err_console.print(f"resuming {self.work} from step {state['step']} of {self.settings['steps']}")
        return state

    def save(self, state: dict) -> None:
        self._dir.save(state)

    def loop(self, bar, task, state: dict | None, save_every: int) -> dict:
        """The training loop's arguments: advance `task` on `bar` every step, resume from `state`, checkpoint here."""
        return {
            "log_every": 1,
            "log": lambda _: bar.advance(task),
            "resume": state,
            "save": self.save,
            "save_every": save_every,
        }

    def loop_args(self, state: dict | None, save_every: int, bar: _TrainProgress, named=None, dist=None) -> dict:
        """The training loop's arguments: resume from `state`, checkpoint here, report each step to `bar`.
        Under torchrun (`dist`) the checkpoints are DCP's, of the sharded `named`."""
        save = self.save
        if dist is not None:
            from finetune.dist_checkpoint import save_dcp

            save = lambda st: save_dcp(self.work, st, named, dist)  # noqa: E731
        return {"resume": state, "save": save, "save_every": save_every, "on_step": bar.on_step}

    def finish(self) -> None:
        self._dir.finish()


class _TrainProgress:
    """Rich progress for a training loop: step, loss, tokens/s and ETA. On a terminal a live bar; otherwise
    (a log file, CI) a plain line every tenth of the run, so a log shows the run moving too."""

    def __init__(self, description: str, steps: int, state: dict | None, quiet: bool = False):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.description, self.steps = description, steps
        self.done = state["step"] if state else 0
        self.tokens, self.seconds = 0, 0.0
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeRemainingColumn(),
        )
        self.live, self.quiet = err_console.is_terminal and not quiet, quiet  # quiet: a torchrun rank other than 0
        self.bar = Progress(*columns, console=err_console, transient=False) if self.live else None
        self.every = max(1, steps // 10)

    def __enter__(self) -> _TrainProgress:
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task(self.description, total=self.steps, completed=self.done, loss="-", tps="-")
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.tokens / self.seconds, 1) if self.seconds > 0 else None

    def on_step(self, info) -> None:
        self.tokens += info.loss.tokens
        self.seconds += info.seconds
        loss = f"{info.loss.lm:.3f}" if not info.loss.mtp else f"{info.loss.lm:.3f} mtp {info.loss.mtp_mean:.3f}"
        tps = f"{self.tokens_per_s:,.0f}" if self.tokens_per_s else "-"
        if self.bar is not None:
            self.bar.update(self.task, completed=info.step, loss=loss, tps=tps)
        elif not self.quiet and (info.step % self.every == 0 or info.step == info.steps):
            left = (info.steps - info.step) * self.seconds / max(1, info.step - self.done)
            err_console.print(
                f"{self.description}: step {info.step}/{info.steps}  loss {loss}  {tps} tok/s  "
                f"{info.seconds:.2f} s/step  ETA {left:.0f}s"
            )


def _checkpoint_tokenizer(model: Path):
    """MODEL must be a checkpoint directory with a tokenizer (a usage failure otherwise) -> its tokenizer."""
    from serve.engine.llm import load_tokenizer

    if not (model / "config.json").is_file():
        fail(f"{model} is not a checkpoint directory (no config.json)")
    tok = load_tokenizer(model)
    if tok is None:
        fail(f"{model} has no tokenizer.json")
    return tok


def _prompt_rows(path: Path, tokenizer) -> list[tuple[list[int], dict, str]]:
    """`finetune.data.prompts.read_prompt_rows`, with an unreadable file or a bad line as a usage error."""
    from finetune.data.prompts import read_prompt_rows

    try:
        return read_prompt_rows(path, tokenizer)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror or e}", code=EXIT_USAGE)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)


def _write_adapter(model: Path, net, work: Path, merge: bool, fingerprint: str | None = None,
                   quant: str | None = None) -> None:  # fmt: skip
    """The LoRA adapter (peft format) in WORK/adapter, and in WORK/adapter_hf the same adapter in transformers'
    layout (peft loads it into GlmMoeDsaForCausalLM, whose experts are fused); with `merge`, WORK also becomes a
    plain checkpoint. `fingerprint`: MODEL's weights' (default: net's base weights'); `quant`: what the adapter
    was trained on (finetune rl --quant int4)."""
    from finetune.lora import merge_lora, save_adapter
    from finetune.lora_hf import export_hf_adapter

    save_adapter(net, work / "adapter", base=str(model.resolve()), fingerprint=fingerprint, quant=quant)
    export_hf_adapter(work / "adapter", work / "adapter_hf", getattr(net.config, "n_routed_experts", None))
    if merge and quant is not None:
        # net's frozen weights were rounded to INT4's grid: the merged checkpoint is MODEL's own weights plus the
        # adapter (the master weights to train on; weights left on the grid lose a later stage's small updates
        # when that stage is served INT4: they round back to the same points)
        from finetune.lora import load_adapter

        base = _load_for_training(model, "merge onto the full-precision checkpoint")
        _write_checkpoint(model, merge_lora(load_adapter(base, work / "adapter")), work)
    elif merge:
        _write_checkpoint(model, merge_lora(net), work)


def _write_sharded(model: Path, net, work: Path, full: bool, merge: bool, dist, fingerprint: str | None) -> None:
    """_write_adapter / _write_checkpoint for a model sharded over torchrun's ranks: every rank sends its shards,
    rank 0 writes. A merged checkpoint is the adapter loaded onto a fresh copy of the base and merged, as
    `glm5 serve --lora` does."""
    state = dist.gather(net, trained_only=not full)
    if dist.is_main:
        from finetune.lora import load_adapter, merge_lora, save_adapter

        if full:
            _write_checkpoint(model, net, work, state)
        else:
            save_adapter(net, work / "adapter", base=str(model.resolve()), fingerprint=fingerprint, state=state)
            if merge:
                base = _load_for_training(model, "fine-tune the full-precision checkpoint")
                _write_checkpoint(model, merge_lora(load_adapter(base, work / "adapter")), work)
    dist.barrier()


def _write_train_log(work: Path, hist) -> None:
    """train_log.jsonl: one line per step (the resumed steps' too), the loss of the whole batch."""
    import json

    lines = [json.dumps({"step": i + 1, "loss": h.lm, "tokens": h.tokens}) for i, h in enumerate(hist)]
    _write_atomic(work / "train_log.jsonl", "\n".join(lines) + "\n")


def _load_for_training(model: Path, int4_hint: str):
    """The checkpoint in fp32 for training; INT4 weights (which do not train) are refused with `int4_hint`."""
    import torch

    from model import GLM5ForCausalLM

    with console.status(f"loading {model}..."):
        net = GLM5ForCausalLM.from_pretrained(model, dtype=torch.float32)
    if (net.config.quantization_config or {}).get("quant_method") == "compressed-tensors":
        fail(f"{model} holds INT4 weights, which do not train", hint=int4_hint)
    return net


def _progress():
    """A step bar: rich's live bar on a terminal; off one (a log file, CI) a plain line per step (_LogSteps)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if not err_console.is_terminal:
        from glm5cli.progress import LogSteps

        return LogSteps()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns, console=err_console)


def _write_checkpoint(source: Path, net, dest: Path, state: dict | None = None) -> None:
    from finetune.run_dir import write_checkpoint

    write_checkpoint(source, net, dest, state)


def _write_atomic(path: Path, text: str) -> None:
    from finetune.run_dir import write_atomic

    write_atomic(path, text)


def _recorded_sequences(files: list[Path], tokenizer) -> list[tuple[list[int], int]]:
    """(ids, prompt length) of every answered model call in the trajectory files; a bad file is a usage error."""
    from finetune.data.trajectories import recorded_sequences

    try:
        return recorded_sequences(files, tokenizer)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)


def _trajectory_files(paths: list[Path]) -> list[Path]:
    from finetune.data.trajectories import trajectory_files

    try:
        return trajectory_files(paths)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)


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
    from finetune.distributed import Distributed

    dist = Distributed.from_env()  # under torchrun
    if dist is not None:
        dist.init()
    main = dist is None or dist.is_main
    tok = _checkpoint_tokenizer(model)
    from finetune.data.trajectories import DataOptions

    opts = DataOptions(include_denied, include_format_errors, include_failed_calls, only_resolved, min_reward, strict,
                       max_len, allow_foreign)  # fmt: skip
    settings = {"model": str(model.resolve()), "data": [str(p.resolve()) for p in data], "steps": steps}
    settings |= {"lr": lr, "rank": rank, "alpha": alpha, "batch_size": batch_size, "max_len": max_len, "seed": seed}
    settings |= {"data_options": opts.__dict__, "pack": pack, "micro_batch": micro_batch}
    if dense_attention:
        settings |= {"dense_attention": True}
    if full:
        settings |= {"full": True, "train_mtp": train_mtp, "router_bias_rate": router_bias_rate}
        if train_mtp:
            settings |= {"mtp_steps": mtp_steps}
    elif train_mtp or router_bias_rate:
        fail("--train-mtp and --router-bias-rate apply to --full fine-tuning", code=EXIT_USAGE)
    qat_scheme = qat_settings(qat, qat_group_size, full, merge)
    if qat_scheme is not None and dist is not None:
        fail("--qat is not supported under torchrun yet: run it as one process", code=EXIT_USAGE)
    if qat_scheme is not None:
        settings |= {"qat": qat, "qat_group_size": qat_group_size}
    if qlora:
        qlora_run.check_flags(model, full, qat, merge, train_mtp)
        settings |= {"qlora": True}
    if export_slime:  # the data only, for slime (glm5cli/slime_cmd.py)
        from glm5cli.slime_cmd import export_sft

        return export_sft(out, *_load_data(data, tok, opts), json_out)
    preflight(model, "full" if full else "sft", max_len, micro_batch or batch_size, rank)  # GPUs only: the plan
    run = _Run(out, settings | {"merge": merge}, added={"data_options.allow_foreign": False})

    from finetune.lora import LoraSettings, add_lora
    from finetune.sft import SFTConfig, train_sft

    saved = run.saved_sequences()
    if saved is not None:
        seqs = [(s, [bool(x) for x in m]) for s, m in saved["sequences"]]
        report = saved["report"]
    else:
        seqs, report = _load_data(data, tok, opts)
    if not seqs:
        fail("no responses to train on: the data holds no model turns to learn from", hint=_filtered_hint(report))
    if dist is not None:
        dist.barrier()  # every rank has read the run folder before rank 0 writes to it
    t0 = time.monotonic()
    if qlora:  # the base frozen as stored, never whole in one process (glm5cli/qlora_run.py)
        net, named = qlora_run.load(model, rank, alpha, seed, dist)
    elif full:
        from finetune.full import FullSettings, prepare_full

        net = _load_for_training(model, "fine-tune the full-precision checkpoint")
        named = prepare_full(net, FullSettings(train_mtp=train_mtp, router_bias_rate=router_bias_rate))
    else:
        net = _load_for_training(model, "fine-tune the full-precision checkpoint")
        net = add_lora(net, LoraSettings(rank=rank, alpha=alpha), seed=seed)
        named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    qat_linears = apply_qat(net, qat_scheme) if qat_scheme is not None else 0
    fingerprint = None
    if dist is not None and not qlora:
        if not full:
            from finetune.lora import weights_fingerprint

            fingerprint = weights_fingerprint(net)  # of the whole base, before it is sharded
        named = dist.shard(net, named)
    state = run.start_resumable(
        {"sequences": [[s, [int(x) for x in m]] for s, m in seqs], "report": report}, named, dist
    )
    if main:
        _show_data(report, json_out)
    cfg = SFTConfig(steps=steps, lr=lr, warmup=max(1, steps // 20), batch_size=batch_size, seed=seed)
    cfg = replace(cfg, micro_batch=micro_batch, pack=pack, pack_len=max_len, mtp_steps=mtp_steps if train_mtp else 0)
    extra = {"named": named, "router_bias_rate": router_bias_rate, "dist": dist}
    title = "fine-tuning (full)" if full else "fine-tuning (LoRA)"
    from contextlib import nullcontext

    from finetune.dsa_warmup import dense_attention as all_keys

    with (
        _TrainProgress(title, steps, state, quiet=not main) as bar,
        all_keys(net) if dense_attention else nullcontext(),
    ):
        hist = train_sft(net, seqs, cfg, **run.loop_args(state, save_every, bar, named, dist), **extra)
    if qlora:
        qlora_run.write_adapter(model, net, run.work, merge, dist)
    elif dist is not None:
        _write_sharded(model, net, run.work, full, merge, dist, fingerprint)
    if dist is not None:
        dist.close()
        if not main:
            return
    elif qlora:
        pass  # written above, by the one process
    elif qat_scheme is not None:
        write_qat_checkpoints(model, net, run.work, qat_scheme, lora=not full)
    elif full:
        _write_checkpoint(model, net, run.work)
    else:
        _write_adapter(model, net, run.work, merge)
    _write_train_log(run.work, hist)
    summary = {
        "out": str(out),
        "adapter": None if full else str(out / "adapter"),
        "adapter_hf": None if full else str(out / "adapter_hf"),  # for peft + transformers
        "merged_checkpoint": str(out) if merge or full else None,
        "examples": len(seqs),
        "trained_tokens": sum(sum(m) for _, m in seqs),
        "steps": steps,
        "loss_first": round(hist[0].lm, 4),
        "loss_last": round(sum(h.lm for h in hist[-10:]) / len(hist[-10:]), 4),
        "mtp_loss_last": round(sum(h.mtp_mean for h in hist[-10:]) / len(hist[-10:]), 4) if train_mtp else None,
        "tokens_per_s": bar.tokens_per_s,
        "seconds": round(time.monotonic() - t0, 1),
        "data": report,
    }
    if qat_scheme is not None:
        summary |= {"int4_checkpoint": str(out / "int4"), "qat_linears": qat_linears}
    run.finish()
    if json_out:
        print_json(summary)
        return
    how = "fully" if full else f"with LoRA (rank {rank})"
    console.print(
        f"[green]fine-tuned[/] {model} {how} on {summary['examples']} sequences "
        f"({summary['trained_tokens']:,} target tokens), loss {summary['loss_first']:.3f} -> "
        f"{summary['loss_last']:.3f}, in {summary['seconds']:.0f}s; "
        + (f"checkpoint: {out}" if full else f"adapter: {out / 'adapter'}")
    )
    if (merge or full) and train_mtp:
        console.print(f"serve it with: glm5 serve {out}   (its MTP layer was trained along: mtp loss "
                      f"{summary['mtp_loss_last']:.3f})")  # fmt: skip
    elif merge or full:
        console.print(f"serve it with: glm5 serve {out}   (then `glm5 finetune align-mtp {out} ...` for MTP drafts)")
    if qat_scheme is not None:
        console.print(f"the INT4 weights it was trained for: glm5 serve {out / 'int4'}")


def _load_data(paths: list[Path], tokenizer, opts) -> tuple[list[tuple[list[int], list[bool]]], dict]:
    """finetune.data.sources.load_sequences, a missing path or (with --strict) a bad record as a usage error."""
    from finetune.data.report import BadRecord
    from finetune.data.sources import load_sequences

    try:
        seqs, report = load_sequences(paths, tokenizer, opts)
    except BadRecord as e:
        fail(str(e), code=EXIT_USAGE, hint="fix or remove that record, or drop --strict to skip it")
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)
    return [(s.ids, s.mask) for s in seqs], report.as_dict()


def _filtered_hint(report: dict) -> str:
    left = report.get("filtered") or {}
    if not left:
        return "record sessions with `glm5 code`, or point --data at a bench run or a chat JSONL file"
    hint = "left out: " + "; ".join(f"{n} {why}" for why, n in left.items())
    prefix = report.get("prefix_past_max_len")
    if prefix:  # the system prompt, tool schemas and task come before the first model turn
        return hint + (f". The shortest prompt before a model turn is {prefix} tokens: raise --max-len above it "
                       "(or record with `glm5 code --profile compact`, a shorter prefix)")  # fmt: skip
    return hint + " (see the flags in --help)"


def _show_data(report: dict, json_out: bool) -> None:
    """What the data load used, on stderr; every skipped record by file and line."""
    tito = report["tito_sequences"]
    err_console.print(
        f"data: {report['sequences']} sequences from {report['sessions']} sessions in {report['files']} files "
        f"({tito} from recorded token ids, {report['sequences'] - tito} rendered), {report['tokens']:,} tokens, "
        f"{report['target_tokens']:,} targets"
        + (f", {report['truncated_to_max_len']} cut to --max-len" if report["truncated_to_max_len"] else "")
    )
    for why, n in (report.get("filtered") or {}).items():
        err_console.print(f"  left out: {n} {why}")
    for line in report["skipped_records"]:
        err_console.print(f"  [yellow]skipped[/] {line}")


app.command("rl")(rl_command)  # `glm5 finetune rl` lives in rl_cmd.py
app.command("distill")(distill_command)  # `glm5 finetune distill` lives in distill_cmd.py
app.command("dsa-warmup")(dsa_warmup)  # GLM-5's DSA adaptation stage lives in stages_cmd.py
app.command("plan")(plan_command)  # `glm5 finetune plan` lives in plan_cmd.py
