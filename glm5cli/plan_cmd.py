"""`glm5 finetune plan`: the per-GPU memory of a fine-tuning layout (finetune/plan.py does the arithmetic; this
only parses and prints), and `preflight`, the same check the training commands run before they load a model."""

from __future__ import annotations

import os
import re
from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, fail, print_json

EXIT_NO_FIT = 3  # the layout does not fit: distinct from a usage error (2) so scripts can tell


def parse_mem(text: str) -> float:
    """'141GB', '141 GB', '80GiB', '1.5e11' -> bytes (GB = 1e9, GiB = 2**30)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([KMGT]i?B?|B)?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot read a memory size from {text!r} (e.g. 141GB, 80GiB)")
    unit = (m.group(2) or "B").upper().removesuffix("B") or "B"
    base = 1024 if unit.endswith("I") else 1000
    power = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit.removesuffix("I") or "B"]
    return float(m.group(1)) * base**power


def plan_cmd(
    model: Path | None = typer.Argument(None, help="A checkpoint directory (its config.json); or use --preset."),
    preset: str | None = typer.Option(None, "--preset", help="tiny, small or glm5 (the real GLM-5's sizes)."),
    gpus: int = typer.Option(8, "--gpus", min=1, help="GPUs in all (FSDP shards over every one)."),
    gpu_mem: str = typer.Option("141GB", "--gpu-mem", help="Memory per GPU (H200: 141GB, H100: 80GB)."),
    method: str = typer.Option("sft", "--method", help="sft, rl, distill (LoRA) or full."),
    base: str | None = typer.Option(
        None, "--base", help="The frozen base's precision: fp8, int4 or bf16 (default: the checkpoint's; preset: fp8)."
    ),
    seq_len: int = typer.Option(4096, "--seq-len", min=1, help="Tokens per row."),
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Rows per forward/backward."),
    rank: int = typer.Option(16, "--rank", min=1, help="LoRA rank."),
    offload_optimizer: bool = typer.Option(
        False, "--offload-optimizer", help="AdamW state in host memory, as `finetune sft --offload-optimizer` keeps it."
    ),
    teacher: str = typer.Option(
        "base", "--teacher", help="distill: base (the student's base, LoRA off), sharded (a second copy) or served."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Per-GPU memory of fine-tuning a model on GPUS GPUs: weights, adapter, gradients, optimizer, FSDP gathers
    and activations, for the layout `finetune sft|rl|distill` build (the base frozen in its precision and sharded,
    LoRA and AdamW sharded, each decoder layer recomputed in the backward).

    Exits 3 when it does not fit, naming what would: more nodes, a shorter sequence, or slime.
    """
    # finetune.plan imports torch: imported here, not at the top (`glm5 --help`'s speed)
    from finetune.plan import Layout, format_plan, plan

    cfg, stored = _config(model, preset)
    try:
        layout = Layout(gpus=gpus, gpu_mem=parse_mem(gpu_mem), method=method, base=base or stored, seq_len=seq_len,
                        micro_batch=micro_batch, lora_rank=rank, offload_optimizer=offload_optimizer, teacher=teacher)  # fmt: skip
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)
    p = plan(cfg, layout)
    if json_out:
        print_json({"fits": p.fits, "total": p.total, "usable": p.usable, "per_gpu": p.rows, "host": p.host,
                    "advice": p.advice, "layout": layout.__dict__})  # fmt: skip
    else:
        console.print(format_plan(p, str(model or preset)), highlight=False, markup=False)
    if not p.fits:
        raise typer.Exit(EXIT_NO_FIT)


def _config(model: Path | None, preset: str | None):
    """(config, its stored precision) from a checkpoint directory or a preset; exactly one of them."""
    # model.config imports torch: imported here, not at the top (`glm5 --help`'s speed)
    from model.config import ConfigError, GLM5Config
    from model.config import preset as get_preset

    if (model is None) == (preset is None):
        fail("give a checkpoint directory or --preset (one of them)", code=EXIT_USAGE)
    try:
        if preset is not None:
            return get_preset(preset), "fp8"
        cfg = GLM5Config.from_pretrained(model)
    except (ConfigError, OSError) as e:
        fail(str(e), code=EXIT_USAGE)
    return cfg, stored_precision(cfg)


def stored_precision(cfg) -> str:
    """fp8, int4 or bf16: how the checkpoint of `cfg` stores its linears."""
    quant = (cfg.quantization_config or {}).get("quant_method")
    return {"fp8": "fp8", "compressed-tensors": "int4"}.get(quant, "bf16")


def preflight(model: Path, method: str, seq_len: int, micro_batch: int = 1, rank: int = 16, devices=None,
              offload: bool = False) -> None:  # fmt: skip
    """The plan's check before a training command loads MODEL on GPUs: the world size (torchrun's WORLD_SIZE) and
    each GPU's memory; a layout that cannot fit stops here with the plan's advice, before minutes of loading.
    No check without CUDA (`devices` None and no GPU): a CPU run's memory is the host's. `devices`:
    (count, bytes per GPU), for tests."""
    # finetune.plan and model.config import torch: imported here, not at the top (`glm5 --help`'s speed)
    from finetune.plan import Layout, PlanError, check
    from model.config import ConfigError, GLM5Config

    if devices is None:
        import torch

        if not torch.cuda.is_available():
            return
        devices = (int(os.environ.get("WORLD_SIZE", "1")), torch.cuda.get_device_properties(0).total_memory)

    try:
        cfg = GLM5Config.from_pretrained(model)
    except (ConfigError, OSError) as e:
        fail(str(e), code=EXIT_USAGE)
    base = stored_precision(cfg) if method != "full" else "bf16"
    layout = Layout(gpus=devices[0], gpu_mem=devices[1], method=method, base=base, seq_len=seq_len,
                    micro_batch=micro_batch, lora_rank=rank, offload_optimizer=offload)  # fmt: skip
    try:
        check(cfg, layout)
    except PlanError as e:
        fail(f"{model} does not fit this layout: {e}", code=EXIT_NO_FIT,
             hint=f"see `glm5 finetune plan {model} --gpus {devices[0]} --method {method} --seq-len {seq_len}`")  # fmt: skip
