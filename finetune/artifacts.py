"""What a finetune run leaves in its folder, each written so that a kill never leaves half of it: the LoRA adapter
(peft's layout and transformers'), a merged or full checkpoint, the INT4 checkpoint of a QAT run, the train log,
a step's adapter, the run's record; and the one atomic-write helper the finetune package uses.

    write_adapter(model_dir, net, work, merge=True)   # WORK/adapter, WORK/adapter_hf, WORK a checkpoint
    write_train_log(work, hist)                       # WORK/train_log.jsonl

Every writer takes the source checkpoint MODEL (its config, tokenizer and templates are copied beside new
weights, and an adapter records it as its base) and the run's work folder (finetune/run_dir.py renames it to OUT
when the run is done). Knows nothing of the command line: `status(text)` is an optional context manager shown
while a long write runs (the CLI's spinner).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch

from finetune.loading import load_for_training
from finetune.lora import BASE_FILE, load_adapter, merge_lora, save_adapter
from finetune.lora_hf import export_hf_adapter
from finetune.qat import remove_qat, write_int4_checkpoint
from finetune.sharded_load import base_format
from model.checkpoint import save_pretrained, side_files
from model.config import GLM5Config

Status = Callable[[str], AbstractContextManager]


def _no_status(_: str) -> AbstractContextManager:
    return nullcontext()


def write_atomic(path: Path, text: str) -> None:
    """`text` to PATH, written aside and renamed: a kill mid-write leaves the previous file (moved from
    finetune/run_dir.py)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_atomic(path: Path, state: dict) -> None:
    """torch.save of `state` to PATH, written aside and renamed."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def replace_dir(write: Callable[[Path], None], dest: Path) -> None:
    """A folder written by `write(tmp)` beside DEST and renamed onto it: a kill never leaves half of one."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


# What a checkpoint folder holds that is not the model but the run that wrote it: a stage trained from that
# checkpoint must not carry them along (a full SFT of an RL checkpoint would otherwise ship RL's adapter beside
# weights it is already merged into, and RL's log as if it were its own).
_RUN_OUTPUTS = ("*.log", "*_log.jsonl", "run.json", "*_run.json", "state.pt", "sequences.json")


def write_checkpoint(source: Path, net, dest: Path, state: dict | None = None) -> None:
    """`net`'s weights plus the `source` checkpoint's other files (config, tokenizer, chat template: its top-level
    files, model/checkpoint.py `side_files`, which refuses links out of it), not the outputs of the run that wrote
    it (its folders, adapters among them, and its logs). `state`: the weights by name, whole, when `net` holds
    only shards of them (finetune/distributed.py). Moved from finetune/run_dir.py."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    for path in side_files(source, ignore=_RUN_OUTPUTS):
        shutil.copyfile(path, Path(dest) / path.name)  # a link's content, as a file of its own
    if state is None:
        net.save_pretrained(dest)
    else:  # save_pretrained reads a model's `config` and `state_dict()`: here the gathered tensors
        save_pretrained(SimpleNamespace(config=net.config, state_dict=lambda: state), dest)


def write_merged(model: Path, work: Path, hint: str, status: Status = _no_status) -> None:
    """WORK as a checkpoint: WORK/adapter loaded onto a fresh copy of MODEL and merged, as `glm5 serve --lora`
    does (`hint`: what to do when MODEL is INT4, which does not load for training)."""
    base = load_for_training(model, hint, status)
    write_checkpoint(model, merge_lora(load_adapter(base, work / "adapter")), work)


def write_adapter(model: Path, net, work: Path, merge: bool, fingerprint: str | None = None,
                  quant: str | None = None, status: Status = _no_status) -> None:  # fmt: skip
    """The LoRA adapter (peft format) in WORK/adapter, and in WORK/adapter_hf the same adapter in transformers'
    layout (peft loads it into GlmMoeDsaForCausalLM, whose experts are fused); with `merge`, WORK also becomes a
    plain checkpoint. `fingerprint`: MODEL's weights' (default: net's base weights'); `quant`: what the adapter
    was trained on (finetune rl --quant int4). Moved from glm5cli/finetune_cmd.py."""
    save_adapter(net, work / "adapter", base=str(model.resolve()), fingerprint=fingerprint, quant=quant)
    export_hf_adapter(work / "adapter", work / "adapter_hf", getattr(net.config, "n_routed_experts", None))
    if merge and quant is not None:
        # net's frozen weights were rounded to INT4's grid: the merged checkpoint is MODEL's own weights plus the
        # adapter (the master weights to train on; weights left on the grid lose a later stage's small updates
        # when that stage is served INT4: they round back to the same points)
        write_merged(model, work, "merge onto the full-precision checkpoint", status)
    elif merge:
        write_checkpoint(model, merge_lora(net), work)


def write_step_adapter(net, dest: Path, model: Path, fingerprint: str, quant: str | None,
                       state: dict | None = None) -> None:  # fmt: skip
    """A step's adapter (agentic RL's OUT/adapters/step-K), written aside and renamed: a kill never leaves half
    an adapter there (`state`: a sharded adapter's, gathered). (Moved from glm5cli/rl_cmd.py.)"""
    replace_dir(lambda tmp: save_adapter(net, tmp, base=str(model.resolve()), fingerprint=fingerprint, quant=quant,
                                         state=state), dest)  # fmt: skip


def write_sharded(model: Path, net, work: Path, full: bool, merge: bool, dist, fingerprint: str | None,
                  status: Status = _no_status) -> None:  # fmt: skip
    """write_adapter / write_checkpoint for a model sharded over torchrun's ranks: every rank sends its shards,
    rank 0 writes. A merged checkpoint is the adapter loaded onto a fresh copy of the base and merged."""
    state = dist.gather(net, trained_only=not full)
    if dist.is_main:
        if full:
            write_checkpoint(model, net, work, state)
        else:
            save_adapter(net, work / "adapter", base=str(model.resolve()), fingerprint=fingerprint, state=state)
            if merge:
                write_merged(model, work, "fine-tune the full-precision checkpoint", status)
    dist.barrier()


def write_qlora_adapter(model: Path, net, work: Path, merge: bool, dist, status: Status = _no_status) -> None:
    """OUT/adapter (peft's files) from the sharded adapter, rank 0 writing; with --merge the adapter is then
    merged into the base loaded whole on rank 0 (the one step that holds the full model). adapter_base.json
    records no weights fingerprint: the base was never whole here to hash (`glm5 serve --lora` skips the check
    for such an adapter) and says which format it was trained over. Moved from glm5cli/qlora_run.py."""
    state = dist.gather(net, trained_only=True) if dist is not None else None
    if dist is None or dist.is_main:
        if state is None:
            state = {n: p.detach() for n, p in net.named_parameters() if "lora_" in n}
        save_adapter(net, work / "adapter", base=str(model.resolve()), fingerprint="-", state=state)
        rec_file = work / "adapter" / BASE_FILE
        rec = json.loads(rec_file.read_text())
        fmt = base_format(GLM5Config.from_pretrained(model))
        rec |= {"weights_fingerprint": None, "trained_over": fmt}
        if fmt == "int4":  # `glm5 serve --lora` warns when it is served without --quant int4
            rec["quant"] = "int4"
        rec_file.write_text(json.dumps(rec, indent=1))
        if merge:
            write_merged(model, work, "merge onto a full-precision checkpoint", status)
    if dist is not None:
        dist.barrier()


def write_qat_checkpoints(model: Path, net, work: Path, s, lora: bool, status: Status = _no_status) -> None:
    """WORK: the trained full-precision checkpoint (with LoRA: WORK/adapter, and the merge); WORK/int4: it in
    compressed-tensors INT4 with the trained scheme, which `glm5 serve WORK/int4` loads. The checkpoint is
    assembled in WORK/.checkpoint first: the INT4 writer copies every file beside the weights, and WORK also
    holds the run's own files (its data, the optimizer state). Moved from glm5cli/stages_cmd.py."""
    remove_qat(net)
    if lora:
        save_adapter(net, work / "adapter", base=str(model.resolve()))
        net = merge_lora(net)
    staging = work / ".checkpoint"
    for old in (staging, work / "int4"):  # what a run killed while writing left
        shutil.rmtree(old, ignore_errors=True)
    write_checkpoint(model, net, staging)
    with status("writing the INT4 checkpoint..."):
        write_int4_checkpoint(staging, work / "int4", s)
    for f in staging.iterdir():
        os.replace(f, work / f.name)
    staging.rmdir()


def write_train_log(work: Path, hist) -> None:
    """train_log.jsonl: one line per step (the resumed steps' too), the loss of the whole batch."""
    lines = [json.dumps({"step": i + 1, "loss": h.lm, "tokens": h.tokens}) for i, h in enumerate(hist)]
    write_atomic(work / "train_log.jsonl", "\n".join(lines) + "\n")


def write_record(path: Path, settings: dict, summary: dict) -> None:
    """The run's record beside its outputs ({"settings", "summary"}: distill_run.json, dsa_warmup.json), which
    stays when RunDir.finish drops its resume files."""
    write_atomic(path, json.dumps({"settings": settings, "summary": summary}, indent=1))
