"""`run_embedded(...)`: what `glm5 serve MODEL_DIR` does: load the checkpoint with a progress display, build the
app, and run uvicorn until interrupted. The engine thread is shut down on the way out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console


def checkpoint_summary(model_dir: Path) -> str:
    files = sorted(model_dir.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    return f"{len(files)} file(s), {size / 2**30:.2f} GiB"


def load_engine(
    model_dir: Path,
    quant: str | None,
    speculative: bool,
    max_num_seqs: int | None,
    max_model_len: int | None,
    console: Console,
    kv_cache_gib: float | None = None,
    num_draft_tokens: int = 3,
    dtype: str = "auto",
    draft_vocab: tuple[int, ...] | None = None,
    adapt: Callable | None = None,
):
    """Build the embedded engine over `model_dir`, showing what it is doing while the weights load.

    quant="int4" quantizes the weights at load (group 128, symmetric; a checkpoint that is already
    compressed-tensors INT4 loads as such without it); speculative=True drafts with the checkpoint's MTP layer.
    `adapt(model) -> model` runs on the loaded weights before quantization (`glm5 serve --lora` merges an
    adapter with it; serve does not import finetune, the CLI passes it in).
    """
    import torch

    from model.modeling import GLM5ForCausalLM
    from serve.engine import LLM, AsyncLLM
    from serve.engine.llm import load_tokenizer, resolve_dtype
    from serve.http.engine_adapter import EmbeddedEngine

    kwargs: dict = {}
    if max_num_seqs:
        kwargs["max_num_seqs"] = max_num_seqs
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    if kv_cache_gib:
        kwargs["kv_cache_gib"] = kv_cache_gib
    if speculative:
        kwargs.update(speculative="mtp", num_draft_tokens=num_draft_tokens, draft_vocab=draft_vocab)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.monotonic()
    with console.status(f"loading {model_dir} ({checkpoint_summary(model_dir)}) onto {device}...", spinner="dots"):
        model = GLM5ForCausalLM.from_pretrained(model_dir, dtype=resolve_dtype(dtype, device), device=device)
        if adapt is not None:
            model = adapt(model)
        if quant == "int4":
            from model.quant_int4 import quantize_int4

            console.print("quantizing weights to INT4 (group 128)...")
            quantize_int4(model, group_size=128, strict=False)
        llm = LLM(model, tokenizer=load_tokenizer(model_dir), device=device, **kwargs)
    console.print(
        f"[green]loaded[/] {model_dir} in {time.monotonic() - t0:.1f}s on {device} "
        f"({str(next(model.parameters()).dtype).removeprefix('torch.')}); "
        f"context {llm.engine.max_model_len} tokens, KV blocks {llm.engine.block_manager.num_blocks}"
        + (f"; MTP speculative decoding, {num_draft_tokens} drafts" if speculative else "")
        + (f" from a {len(draft_vocab)}-token draft vocabulary" if speculative and draft_vocab else "")
        + ("; INT4 weights" if quant == "int4" else "")
    )
    return EmbeddedEngine(AsyncLLM(llm.engine)), llm.tokenizer


def run_embedded(
    model_dir: Path,
    host: str,
    port: int,
    api_key: str | None,
    served_model_name: str | None,
    quant: str | None,
    speculative: bool,
    max_num_seqs: int | None,
    max_queue: int,
    max_model_len: int | None,
    kv_cache_gib: float | None = None,
    num_draft_tokens: int = 3,
    dtype: str = "auto",
    draft_vocab: tuple[int, ...] | None = None,
    adapt: Callable | None = None,
) -> int:
    import uvicorn

    from serve.http.app import create_app
    from serve.http.settings import ServerSettings

    console = Console(stderr=True)
    engine, tokenizer = load_engine(
        model_dir,
        quant,
        speculative,
        max_num_seqs,
        max_model_len,
        console,
        kv_cache_gib,
        num_draft_tokens,
        dtype,
        draft_vocab,
        adapt,
    )
    if tokenizer is None:
        raise SystemExit(f"{model_dir} has no tokenizer.json; the OpenAI routes need one")
    name = served_model_name or model_dir.resolve().name
    running = max_num_seqs or engine.core.config.max_num_seqs
    settings = ServerSettings(served_model_name=name, api_key=api_key, max_in_flight=running + max_queue)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    def ready() -> None:
        console.print(
            f"[bold green]ready[/] http://{host}:{port}/v1  model [bold]{name}[/]"
            + ("  (API key required)" if api_key else "")
        )

    app = create_app(engine, tokenizer, settings, on_ready=ready)
    if engine.core.runner.device.type == "cpu":
        from model import cpu_kernels

        console.print(f"[dim]{cpu_kernels.status()}[/]", highlight=False)  # builds them on a first run (seconds)
    console.print(f"warming up (one generation) at http://{host}:{port} ...")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.shutdown()
    return 0
