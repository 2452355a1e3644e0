"""`glm5 model quantize`: write a checkpoint as compressed-tensors W4A16 (pack-quantized), the 4-bit format
that vLLM, sglang and `glm5 serve` load. Mounted in `model_cmd.py` as `app.command("quantize")(quantize)`."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import console, fail, print_json


def quantize(
    src: Path = typer.Argument(..., help="Checkpoint directory (config.json + *.safetensors), unquantized."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the quantized checkpoint to."),
    bits: int = typer.Option(4, "--bits", help="Weight bits. Only 4 (W4A16) is supported."),
    group_size: int = typer.Option(128, "--group-size", help="Input columns per scale: 32, 64, 128 or 256."),
    asymmetric: bool = typer.Option(False, "--asymmetric", help="Store a zero point per group (default symmetric)."),
    keep: list[str] = typer.Option(
        None,
        "--keep",
        help="Regex of modules to keep in high precision, instead of GLM-5's FP8 split (repeatable).",
    ),
    observer: str = typer.Option(
        "mse",
        "--observer",
        metavar="<mse|minmax>",
        help="Range per group: 'mse' (search the clipping with least error) or 'minmax'.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Quantize a checkpoint's linear weights to int4, group-wise, in the compressed-tensors format."""
    # model imports torch: imported here, for speed, so that `glm5 --help` loads neither
    from model.compressed_tensors import CompressedTensorsError
    from model.int4_linear import GROUP_SIZES
    from model.int4_write import quantize_checkpoint
    from model.quant_int4 import DEFAULT_SKIP

    if bits != 4:
        fail(f"--bits {bits} is not supported; glm5 writes 4-bit (W4A16) checkpoints", code=2)
    if group_size not in GROUP_SIZES:
        fail(f"--group-size {group_size} is not supported", code=2, hint=f"choose one of {GROUP_SIZES}")
    if observer not in ("mse", "minmax"):
        fail(f"--observer {observer!r} is not supported", code=2, hint="choose 'mse' or 'minmax'")
    if not (src / "config.json").is_file():
        fail(f"{src} is not a checkpoint directory (no config.json)")
    if out.exists() and any(out.iterdir()):
        fail(f"{out} exists and is not empty", hint="choose a new --out directory")
    skip = tuple(keep) if keep else DEFAULT_SKIP
    try:
        if as_json:
            summary = quantize_checkpoint(src, out, group_size, not asymmetric, skip, mse=observer == "mse")
        else:
            with console.status("quantizing...") as status:
                summary = quantize_checkpoint(
                    src,
                    out,
                    group_size,
                    not asymmetric,
                    skip,
                    progress=lambda m: status.update(f"quantizing {m}"),
                    mse=observer == "mse",
                )
    except (ValueError, FileNotFoundError, CompressedTensorsError) as e:
        fail(str(e))
    summary |= {"out": str(out), "group_size": group_size, "symmetric": not asymmetric, "observer": observer}
    if as_json:
        print_json(summary)
        return
    ratio = summary["bytes_out"] / max(summary["bytes_in"], 1)
    console.print(
        f"wrote {out}: {summary['quantized_modules']} linears in int4 (group {group_size}, "
        f"{'asymmetric' if asymmetric else 'symmetric'}), {len(summary['ignored_modules'])} kept in high precision; "
        f"{summary['bytes_out'] / 2**20:.1f} MiB ({ratio:.2f}x of {summary['bytes_in'] / 2**20:.1f} MiB)"
    )
