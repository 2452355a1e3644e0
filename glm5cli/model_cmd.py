"""`glm5 model`: create, inspect, convert and quantize GLM-5 checkpoints (`quantize` lives in quantize_cmd.py).

torch and `model` (which imports torch) are imported inside the commands, for speed: `glm5 --help` loads neither.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import typer

from glm5cli.common import console, fail, print_json
from glm5cli.help_format import WholeSummaries
from glm5cli.quantize_cmd import quantize

app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, cls=WholeSummaries
)  # plain help: readable at 80 columns (glm5cli/app.py)
app.command("quantize")(quantize)


@app.command("init")
def init(
    preset: str = typer.Option("tiny", "--preset", metavar="<tiny|small>", help="tiny (tests) or small (benchmarks)."),
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint into."),
    seed: int = typer.Option(0, "--seed", help="Random seed for the weights."),
    dtype: str = typer.Option("float32", "--dtype", metavar="<float32|bfloat16>", help="float32 or bfloat16."),
    overrides: list[str] = typer.Option(
        None, "--set", help="Change one config.json field of the preset: KEY=VALUE (JSON value), repeatable."
    ),
) -> None:
    """Write a random-initialised checkpoint (config, generation config, weights, tokenizer) from a preset.

    Example: glm5 model init --preset tiny --set hidden_size=128 --set index_topk=64 --out ckpt
    """
    import torch

    from model import GLM5ForCausalLM
    from model.checkpoint import save_pretrained
    from model.config import PRESETS, ConfigError
    from model.config import preset as get_preset
    from model.tokenizer import save_tokenizer_files

    try:
        cfg = get_preset(preset)
    except ConfigError as e:
        fail(str(e))
    if preset not in ("tiny", "small"):
        fail(
            f"preset {preset!r} has {sum(_counts(cfg)[k] for k in ('total', 'mtp')):,} parameters: too big to "
            "initialise here",
            hint=f"use one of {', '.join(p for p in PRESETS if p != preset)}",
        )
    if dtype not in ("float32", "bfloat16"):
        fail(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    if overrides:
        cfg = _with_overrides(cfg, overrides)
    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty", hint="choose a new --out directory")
    torch_dtype = getattr(torch, dtype)
    model = GLM5ForCausalLM.from_config(cfg.replace(dtype=dtype), seed=seed, dtype=torch_dtype)
    save_pretrained(model, out)
    save_tokenizer_files(out)  # tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json
    n = sum(p.numel() for p in model.state_dict().values())
    console.print(f"wrote {preset} checkpoint ({n:,} parameters, {dtype}) to {out}")


def _with_overrides(cfg, overrides: list[str]):
    """cfg with KEY=VALUE fields changed (VALUE read as JSON, else as a string); a clear error for a bad one."""
    from model.config import ConfigError

    fields = {f.name for f in dataclasses.fields(cfg)} - {"extra"}
    changes = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            fail(f"--set {item!r}: expected KEY=VALUE with KEY a config.json field",
                 hint="e.g. --set hidden_size=128; see a checkpoint's config.json for the fields")  # fmt: skip
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        changes[key] = tuple(value) if isinstance(value, list) else value
    try:
        return cfg.replace(**changes)
    except (ConfigError, TypeError) as e:
        fail(f"--set: {e}")


def _counts(cfg):
    from model.config import count_parameters

    return count_parameters(cfg)


def describe(cfg, source: str, directory: Path | None = None) -> dict:
    """Everything `info` shows, as a plain dict (what --json prints)."""
    from model.config import count_parameters, memory_bytes

    mlp, idx = cfg.layer_mlp_types, cfg.layer_indexer_types
    out = {
        "source": source,
        "layers": {
            "decoder": cfg.num_hidden_layers,
            "mtp": cfg.num_nextn_predict_layers,
            "dense": mlp.count("dense"),
            "moe": mlp.count("sparse"),
            "indexer_full": idx.count("full"),
            "indexer_shared": idx.count("shared"),
        },
        "experts": {"routed": cfg.n_routed_experts, "active": cfg.num_experts_per_tok, "shared": cfg.n_shared_experts},
        "attention": {
            "heads": cfg.num_attention_heads,
            "kv_lora_rank": cfg.kv_lora_rank,
            "qk_rope_head_dim": cfg.qk_rope_head_dim,
            "index_topk": cfg.index_topk,
        },
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "dtype": cfg.dtype,
        "parameters": count_parameters(cfg),
        "memory_bytes": memory_bytes(cfg),
    }
    if directory is not None:
        files = sorted(p.name for p in directory.iterdir() if p.is_file())
        out["files"] = files
        out["weights_bytes_on_disk"] = sum((directory / f).stat().st_size for f in files if f.endswith(".safetensors"))
        out["has_tokenizer"] = "tokenizer.json" in files
        out["quantization"] = _quantization_label(cfg.quantization_config)
    return out


def _quantization_label(q: dict | None) -> str | None:
    """A short name for a checkpoint's `quantization_config`: 'fp8 block 128x128', 'int4 g128 symmetric', None."""
    if not q:
        return None
    if q.get("quant_method") == "fp8":
        return "fp8 block " + "x".join(str(b) for b in q.get("weight_block_size") or [])
    if q.get("quant_method") == "compressed-tensors":
        for group in (q.get("config_groups") or {}).values():
            w = group.get("weights") or {}
            sym = "symmetric" if w.get("symmetric", True) else "asymmetric"
            return f"int{w.get('num_bits', 4)} g{w.get('group_size')} {sym} ({q.get('format', 'pack-quantized')})"
    return str(q.get("quant_method"))


@app.command("info")
def info(
    path: Path | None = typer.Argument(None, help="Checkpoint directory (with config.json)."),
    preset: str | None = typer.Option(
        None,
        "--preset",
        metavar="<tiny|small|glm5>",
        help="Describe a preset instead: tiny, small, glm5.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Show a checkpoint's layers, total and active parameters, and memory for weights and KV cache."""
    from model.config import ConfigError, GLM5Config, human_bytes, human_count
    from model.config import preset as get_preset

    if (path is None) == (preset is None):
        fail("give a checkpoint directory or --preset NAME (one of them)", code=2)
    try:
        if preset is not None:
            cfg, d = get_preset(preset), describe(get_preset(preset), f"preset {preset}")
        else:
            cfg = GLM5Config.from_pretrained(path)
            d = describe(cfg, str(path), path if path.is_dir() else None)
    except ConfigError as e:
        fail(str(e))
    if as_json:
        print_json(d)
        return
    p, m, la = d["parameters"], d["memory_bytes"], d["layers"]
    rows = [
        ("source", d["source"]),
        (
            "layers",
            f"{la['decoder']} decoder ({la['dense']} dense, {la['moe']} MoE) + {la['mtp']} MTP; "
            f"indexer {la['indexer_full']} full / {la['indexer_shared']} shared",
        ),
        ("experts", f"{cfg.n_routed_experts} routed, {cfg.num_experts_per_tok} active, {cfg.n_shared_experts} shared"),
        (
            "parameters",
            f"{human_count(p['total'])} total, {human_count(p['active'])} active (+{human_count(p['mtp'])} MTP)",
        ),
        ("weights", " | ".join(f"{k} {human_bytes(m[k])}" for k in ("bf16", "fp8", "int4"))),
        ("KV cache", f"{human_bytes(m['kv_cache_per_1k_tokens_bf16'])} per 1K tokens (bf16, latent + index keys)"),
    ]
    if "files" in d:
        rows.append(("tokenizer", "yes" if d["has_tokenizer"] else "no tokenizer files"))
        kind = d["quantization"] or cfg.dtype
        rows.append(("on disk", f"{human_bytes(d['weights_bytes_on_disk'])} of safetensors ({kind})"))
    for k, v in rows:
        console.print(f"[bold]{k:>10}[/]  {v}", highlight=False)


@app.command("convert")
def convert(
    src: Path = typer.Argument(..., help="Checkpoint directory: bf16, fp32 or block-FP8 (GLM-5-FP8) weights."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the converted checkpoint to."),
    dtype: str = typer.Option("bfloat16", "--dtype", metavar="<bfloat16|float32>", help="bfloat16 or float32."),
    max_shard_size: str = typer.Option("5GB", "--max-shard-size", help="Largest safetensors shard, e.g. 5GB."),
) -> None:
    """Rewrite a checkpoint in another dtype (FP8 weights are dequantised with their block scales).

    The tokenizer files and chat template are copied along. INT4 (compressed-tensors) checkpoints are not
    converted back: quantize from the original weights instead.
    """
    import torch

    from model import GLM5ForCausalLM
    from model.checkpoint import CheckpointError, side_files
    from model.config import ConfigError

    if dtype not in ("float32", "bfloat16"):
        fail(f"--dtype must be float32 or bfloat16, got {dtype!r}", code=2)
    if not (src / "config.json").is_file():
        fail(f"{src} is not a checkpoint directory (no config.json)")
    quant = json.loads((src / "config.json").read_text()).get("quantization_config") or {}
    if quant.get("quant_method") == "compressed-tensors":
        fail(f"{src} holds INT4 (compressed-tensors) weights; convert the unquantized checkpoint instead")
    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty", hint="choose a new --out directory")
    try:
        with console.status(f"loading {src}..."):
            model = GLM5ForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype))
    except (CheckpointError, ConfigError) as e:
        fail(str(e))
    model.config = model.config.replace(dtype=dtype)
    with console.status(f"writing {out}..."):
        model.save_pretrained(out, max_shard_size=max_shard_size)
        keep = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
        for path in side_files(src):
            if path.name in keep:
                shutil.copyfile(path, out / path.name)
    console.print(f"wrote {out} ({dtype}{', dequantised from FP8' if quant.get('quant_method') == 'fp8' else ''})")
