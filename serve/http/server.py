"""`run_embedded(...)`: what `glm5 serve MODEL_DIR` does: bind the port, load the checkpoint with a progress
display, build the app, and run uvicorn on the bound socket until interrupted. The engine thread is shut down on
the way out.

The port is bound first, so a port in use is reported at once rather than after the weights loaded, and
`--port 0` gets a real port from the OS, which the ready line prints. Memory: unless told (`--kv-cache-gib`),
the KV cache is sized to what `max_num_seqs` sequences of the full context can use, at most 1 GiB -- a 1 GiB
cache of zeros for a 5 MB model was most of the server's resident memory.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from serve.http import logs


def checkpoint_summary(model_dir: Path) -> str:
    files = sorted(model_dir.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    return f"{len(files)} file(s), {size / 2**30:.2f} GiB"


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening: clients are refused, not queued, while the model loads)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        hint = "; pick another with --port (0: any free port)" if e.errno in (98, 48, 10048) else ""
        raise SystemExit(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
    return sock


def default_kv_cache_gib(cfg, dtype, max_num_seqs: int, max_model_len: int | None, cap_gib: float = 1.0) -> float:
    """KV memory for `max_num_seqs` sequences of the whole context, at most `cap_gib`."""
    from serve.engine.kv_cache import KVCache

    context = max_model_len or cfg.max_position_embeddings
    need = max_num_seqs * context * KVCache.bytes_per_token(cfg, dtype) / 2**30
    return min(cap_gib, need)


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
    prefix_caching: bool = True,
    lora: Path | None = None,
):
    """Build the embedded engine over `model_dir`, showing what it is doing while the weights load.

    quant="int4" quantizes the weights at load (group 128, symmetric; a checkpoint that is already
    compressed-tensors INT4 loads as such without it); speculative=True drafts with the checkpoint's MTP layer.
    `adapt(model) -> model` runs on the loaded weights before quantization (`glm5 serve --lora` merges an
    adapter with it; serve does not import finetune, the CLI passes it in). `lora`, with quant="int4": a peft
    adapter applied after quantization, served beside each INT4 layer's int4 weight (`attach_lora`), so the
    served change is exactly the adapter's; merged first, every weight would be rounded anew.
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
    if not prefix_caching:
        kwargs["enable_prefix_caching"] = False
    if speculative:
        kwargs.update(speculative="mtp", num_draft_tokens=num_draft_tokens, draft_vocab=draft_vocab)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.monotonic()
    with console.status(f"loading {model_dir} ({checkpoint_summary(model_dir)}) onto {device}...", spinner="dots"):
        model = GLM5ForCausalLM.from_pretrained(model_dir, dtype=resolve_dtype(dtype, device), device=device)
        if not kv_cache_gib:
            from serve.engine.config import EngineConfig

            seqs = max_num_seqs or EngineConfig.max_num_seqs
            param_dtype = next(model.parameters()).dtype
            kwargs["kv_cache_gib"] = default_kv_cache_gib(model.config, param_dtype, seqs, max_model_len)
        if adapt is not None:
            model = adapt(model)
        if quant == "int4":
            from model.quant_int4 import quantize_int4

            console.print("quantizing weights to INT4 (group 128)...")
            quantize_int4(model, group_size=128, strict=False)
        if lora is not None:
            from serve.http.weight_updates import UpdateError, attach_lora

            try:
                n = attach_lora(model, Path(lora))
            except UpdateError as e:
                raise SystemExit(f"--lora: {e}") from None
            console.print(f"LoRA adapter {lora}: beside the int4 weights of {n} layers, merged into the others")
        llm = LLM(model, tokenizer=load_tokenizer(model_dir), device=device, **kwargs)
    from model.int4_linear import Int4Linear

    int4_checkpoint = quant != "int4" and any(isinstance(m, Int4Linear) for m in model.modules())
    console.print(
        f"[green]loaded[/] {model_dir} in {time.monotonic() - t0:.1f}s on {device} "
        f"({str(next(model.parameters()).dtype).removeprefix('torch.')}); "
        f"context {llm.engine.max_model_len} tokens, KV blocks {llm.engine.block_manager.num_blocks}"
        + (f"; MTP speculative decoding, {num_draft_tokens} drafts" if speculative else "")
        + (f" from a {len(draft_vocab)}-token draft vocabulary" if speculative and draft_vocab else "")
        + ("; INT4 weights" if quant == "int4" else "; INT4 weights (the checkpoint's)" if int4_checkpoint else "")
    )
    return EmbeddedEngine(AsyncLLM(llm.engine)), llm.tokenizer


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
    max_body_mb: float = 32.0,
    access_log: bool = True,
    prefix_caching: bool = True,
    lora: Path | None = None,
) -> int:
    import uvicorn

    from serve.http.app import create_app
    from serve.http.settings import ServerSettings, check_api_key
    from serve.http.template import TemplateUnusable, load_renderer

    try:
        check_api_key(api_key)  # before minutes of loading, not after
    except ValueError as e:
        raise SystemExit(str(e)) from None
    console = logs.SafeConsole(stderr=True)
    sock = bind(host, port)
    port = sock.getsockname()[1]
    try:
        chat_template = load_renderer(model_dir)
    except TemplateUnusable as e:
        sock.close()
        raise SystemExit(f"{e}\nFix the template, or remove it to serve with GLM-5's built-in chat format.") from None
    if chat_template is not None:
        console.print(f"chat template: the checkpoint's own ({chat_template.origin}), not GLM-5's built-in one")
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
        prefix_caching,
        lora,
    )
    if tokenizer is None:
        raise SystemExit(f"{model_dir} has no tokenizer.json; the OpenAI routes need one")
    name = served_model_name or model_dir.resolve().name
    running = max_num_seqs or engine.core.config.max_num_seqs
    settings = ServerSettings(
        served_model_name=name,
        api_key=api_key,
        max_in_flight=running + max_queue,
        max_body_bytes=int(max_body_mb * 2**20),
        access_log=access_log,
        chat_template=chat_template,
        loopback_only=is_loopback(host),
    )
    if not is_loopback(host) and not api_key:
        console.print(f"[yellow]warning:[/] serving on {host} with no API key: anyone who reaches the port can use "
                      "the model and load weights (--api-key, or GLM5_API_KEY)", highlight=False)  # fmt: skip
    logs.configure(logging.INFO)  # every message escaped: paths, model names and errors are clients' text
    url = f"http://{host}:{port}"

    def ready() -> None:
        console.print(
            f"[bold green]ready[/] {url}/v1  model [bold]{name}[/]" + ("  (API key required)" if api_key else ""),
            highlight=False,
        )

    app = create_app(engine, tokenizer, settings, on_ready=ready)
    if engine.core.runner.device.type == "cpu":
        from model import kernels

        console.print(f"[dim]{kernels.status()}[/]", highlight=False)  # builds them on a first run (seconds)
    console.print(f"warming up (one generation) at {url} ...", highlight=False)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the SIGINT it shut down on; a requested stop is a clean exit (as uvicorn.run)
    finally:
        engine.shutdown()
        sock.close()
    return 0
