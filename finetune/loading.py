"""What a training recipe reads before it trains, each refusal a finetune.errors error: the checkpoint in fp32
(INT4 weights do not train), its tokenizer, and the data (sequences with target masks, prompt rows, recorded
responses), with an unreadable file or a bad record as a usage error naming where it is."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from finetune.data.prompts import read_prompt_rows
from finetune.data.report import BadRecord
from finetune.data.sources import load_sequences
from finetune.data.trajectories import recorded_sequences as read_recorded
from finetune.data.trajectories import trajectory_files as find_trajectories
from finetune.errors import RunError, UsageError
from finetune.lora import LoraSettings
from finetune.sharded_load import base_format, load_lora_sharded
from model import GLM5ForCausalLM
from model.checkpoint import CheckpointError
from model.config import GLM5Config
from serve.engine.llm import load_tokenizer


def checkpoint_tokenizer(model: Path):
    """MODEL must be a checkpoint directory with a tokenizer -> its tokenizer."""
    if not (model / "config.json").is_file():
        raise RunError(f"{model} is not a checkpoint directory (no config.json)")
    tok = load_tokenizer(model)
    if tok is None:
        raise RunError(f"{model} has no tokenizer.json")
    return tok


def load_qlora(model: Path, settings: LoraSettings, dist, seed: int,
               status: Callable[[str], AbstractContextManager] | None = None):  # fmt: skip
    """--qlora's model: LoRA over MODEL's base frozen as stored, this rank's shards only (finetune/sharded_load.py)
    -> (the model, its trained parameters by name); a checkpoint that does not fit is a RunError."""
    fmt = base_format(GLM5Config.from_pretrained(model))
    with (status or (lambda _: nullcontext()))(f"loading {model} ({fmt} base, this rank's shards only)..."):
        try:
            return load_lora_sharded(model, settings, dist, seed=seed)
        except (CheckpointError, ValueError) as e:
            raise RunError(str(e)) from None


def check_qlora_merge(model: Path, merge: bool) -> None:
    """--merge writes full-precision weights: over an INT4 --qlora base it is a usage error naming what to do."""
    if merge and base_format(GLM5Config.from_pretrained(model)) == "int4":
        raise UsageError("--merge needs full-precision weights; this base is INT4",
                         f"serve the adapter beside the INT4 weights: glm5 serve {model} --quant int4 --lora OUT/adapter")  # fmt: skip


def load_for_training(model: Path, int4_hint: str, status: Callable[[str], AbstractContextManager] | None = None):
    """The checkpoint in fp32 for training; INT4 weights (which do not train) are refused with `int4_hint`.
    `status(text)`: a context manager shown while it loads."""
    with (status or (lambda _: nullcontext()))(f"loading {model}..."):
        net = GLM5ForCausalLM.from_pretrained(model, dtype=torch.float32)
    if (net.config.quantization_config or {}).get("quant_method") == "compressed-tensors":
        raise RunError(f"{model} holds INT4 weights, which do not train", int4_hint)
    return net


def load_data(paths: list[Path], tokenizer, opts) -> tuple[list[tuple[list[int], list[bool]]], dict]:
    """finetune.data.sources.load_sequences -> ([(ids, target mask)], the report as a dict); a missing path or
    (with --strict) a bad record as a usage error."""
    try:
        seqs, report = load_sequences(paths, tokenizer, opts)
    except BadRecord as e:
        raise UsageError(str(e), "fix or remove that record, or drop --strict to skip it") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    return [(s.ids, s.mask) for s in seqs], report.as_dict()


def filtered_hint(report: dict) -> str:
    """What to do when the data left nothing to train on: what the filters left out, or where data comes from."""
    left = report.get("filtered") or {}
    if not left:
        return "record sessions with `glm5 code`, or point --data at a bench run or a chat JSONL file"
    hint = "left out: " + "; ".join(f"{n} {why}" for why, n in left.items())
    prefix = report.get("prefix_past_max_len")
    if prefix:  # the system prompt, tool schemas and task come before the first model turn
        return hint + (f". The shortest prompt before a model turn is {prefix} tokens: raise --max-len above it "
                       "(or record with `glm5 code --profile compact`, a shorter prefix)")  # fmt: skip
    return hint + " (see the flags in --help)"


def prompt_rows(path: Path, tokenizer) -> list[tuple[list[int], dict, str]]:
    """`finetune.data.prompts.read_prompt_rows`, with an unreadable file or a bad line as a usage error."""
    try:
        return read_prompt_rows(path, tokenizer)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(str(e)) from None


def recorded_sequences(files: list[Path], tokenizer) -> list[tuple[list[int], int]]:
    """(ids, prompt length) of every answered model call in the trajectory files; a bad file is a usage error."""
    try:
        return read_recorded(files, tokenizer)
    except ValueError as e:
        raise UsageError(str(e)) from None


def trajectory_files(paths: list[Path]) -> list[Path]:
    """The trajectory files under PATHS; a path that holds none is a usage error."""
    try:
        return find_trajectories(paths)
    except ValueError as e:
        raise UsageError(str(e)) from None
