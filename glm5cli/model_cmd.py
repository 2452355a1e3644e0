"""`glm5 model`: create and inspect GLM-5 checkpoints (`init`, `info`; `convert` / `quantize` join later)."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import console, fail, print_json

app = typer.Typer(no_args_is_help=True)


def _write_tokenizer_files(out_dir: Path) -> bool:
    """Write tokenizer.json and the chat template next to the weights; False when this build has no tokenizer."""
    try:
        from model.tokenizer import save_tokenizer_files
    except ModuleNotFoundError as e:
        if e.name != "model.tokenizer":
            raise
        return False
    save_tokenizer_files(out_dir)
    return True


@app.command("init")
def init(
    preset: str = typer.Option("tiny", "--preset", help="tiny (tests) or small (benchmarks)."),
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint into."),
    seed: int = typer.Option(0, "--seed", help="Random seed for the weights."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16."),
) -> None:
    """Write a random-initialised checkpoint (config, generation config, weights, tokenizer) from a preset."""
    import torch

    from model import GLM5ForCausalLM
    from model.checkpoint import save_pretrained
    from model.config import PRESETS, ConfigError
    from model.config import preset as get_preset

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
    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty", hint="choose a new --out directory")
    torch_dtype = getattr(torch, dtype)
    model = GLM5ForCausalLM.from_config(cfg.replace(dtype=dtype), seed=seed, dtype=torch_dtype)
    save_pretrained(model, out)
    has_tok = _write_tokenizer_files(out)
    n = sum(p.numel() for p in model.state_dict().values())
    console.print(f"wrote {preset} checkpoint ({n:,} parameters, {dtype}) to {out}")
    if not has_tok:
        console.print("[yellow]note:[/] this build has no tokenizer yet; the checkpoint has no tokenizer files")


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
    return out


@app.command("info")
def info(
    path: Path | None = typer.Argument(None, help="Checkpoint directory (with config.json)."),
    preset: str | None = typer.Option(None, "--preset", help="Describe a preset instead: tiny, small, glm5."),
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
        rows.append(("on disk", f"{human_bytes(d['weights_bytes_on_disk'])} of safetensors ({cfg.dtype})"))
    for k, v in rows:
        console.print(f"[bold]{k:>10}[/]  {v}", highlight=False)
