"""`glm5 serve`: the OpenAI-compatible server (embedded engine), or sglang / vLLM started with GLM-5's flags."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from glm5cli.common import EXIT_USAGE, console, err_console, fail
from serve.http.settings import check_api_key
from serve.launchers.common import EngineNotInstalled, ServerOptions
from serve.launchers.topology import Topology, TopologyError, checkpoint_precision, default_speculative

if TYPE_CHECKING:
    from serve.launchers.launch import Launch


class EngineChoice(str, Enum):
    embedded = "embedded"
    sglang = "sglang"
    vllm = "vllm"


def serve(
    model: str = typer.Argument(..., help="Checkpoint directory (or, with --engine sglang|vllm, a hub id)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on (0: any free port; the ready line names it)."),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="GLM5_API_KEY", help="Require this bearer token (env GLM5_API_KEY)."
    ),
    served_model_name: str | None = typer.Option(None, help="Model name clients send (default: the directory name)."),
    quant: str | None = typer.Option(
        None,
        metavar="<int4>",
        help="Quantize weights at load: int4 (embedded engine only).",
    ),
    speculative: str | None = typer.Option(
        None,
        metavar="<mtp|off>",
        help="mtp: draft with GLM-5's MTP layer; off: none. Default: mtp for sglang/vllm, off embedded.",
    ),
    num_draft_tokens: int = typer.Option(
        3, min=1, max=3, help="Tokens the MTP layer drafts per step (1-3; sglang: EAGLE steps N, draft tokens N+1)."
    ),
    draft_vocab: Path | None = typer.Option(
        None,
        help="JSON file of the token ids drafts are drawn from (FR-Spec: each draft then reads only those rows of "
        "the lm_head; outputs are unchanged). finetune.mtp_align.draft_vocab makes one. Embedded engine, with "
        "--speculative mtp.",
    ),
    lora: Path | None = typer.Option(
        None,
        help="A LoRA adapter (peft format, e.g. from `glm5 finetune sft`) merged into the weights at load; with "
        "--quant int4, served beside the INT4 layers' int4 weights (their adapter change exact, not rounded "
        "anew). Embedded engine.",
    ),
    max_num_seqs: int | None = typer.Option(None, help="Most requests decoded at once."),
    max_queue: int = typer.Option(256, help="Most requests waiting; more get 429 (embedded engine)."),
    max_model_len: int | None = typer.Option(None, help="Context length (default: the checkpoint's)."),
    kv_cache_gib: float | None = typer.Option(None, help="KV-cache memory for the embedded engine, GiB."),
    dtype: str = typer.Option(
        "auto",
        metavar="<auto|float32|bfloat16>",
        help="Weights and KV cache of the embedded engine: auto (bfloat16 on a GPU, float32 on CPU, where it "
        "decodes faster), float32 or bfloat16 (on CPUs with AMX, bfloat16 prefills long prompts 1.2-2x faster).",
    ),
    max_body_mb: float = typer.Option(
        32.0, min=0.001, help="Largest request body accepted, MB; larger ones get 413 (embedded engine)."
    ),
    access_log: bool = typer.Option(
        True, "--access-log/--no-access-log", help="Log one line per request (embedded engine)."
    ),
    prefix_caching: bool = typer.Option(
        True,
        "--prefix-caching/--no-prefix-caching",
        help="Reuse the KV of prompt prefixes seen before (embedded engine). Off: every request is computed the "
        "same way whatever ran before it (an RL rollout engine that must match an in-process one).",
    ),
    engine: EngineChoice = typer.Option(EngineChoice.embedded, help="embedded, or an external engine to launch."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the sglang/vLLM command (every node's, with --nnodes > 1) and exit."
    ),
    nnodes: int = typer.Option(1, help="Nodes in a multi-node sglang/vLLM launch."),
    node_rank: int = typer.Option(0, help="This node's rank (0 serves the API)."),
    dist_init_addr: str | None = typer.Option(None, help="HOST:PORT of node 0 (multi-node)."),
    gpus_per_node: int = typer.Option(8, help="GPUs on each node."),
    tp: int | None = typer.Option(None, help="Tensor parallel size (default: all GPUs)."),
    dp: int = typer.Option(1, help="Data parallel size."),
    ep: int = typer.Option(1, help="Expert parallel size."),
    dp_attention: bool = typer.Option(False, "--dp-attention", help="Data-parallel attention (high concurrency)."),
    precision: str = typer.Option(
        "auto", metavar="<auto|fp8|bf16|int4>", help="auto (read the checkpoint), fp8, bf16 or int4."
    ),
    gpu_memory_gib: float | None = typer.Option(
        None,
        help="Memory per GPU, to check the weights fit (default by --hardware: H100 80, H200 141, B200 180, "
        "AMD 192 as on MI300X; MI325X 256, MI355X 288).",
    ),
    hardware: str = typer.Option(
        "h200",
        metavar="<h200|h100|b200|amd>",
        help="h200, h100, b200 or amd (MI300X/MI325X/MI355X): the sglang recipe's backends for it.",
    ),
    socket_ifname: str | None = typer.Option(
        None, help="Multi-node: the network interface the nodes talk over (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)."
    ),
    rollout_lora_rank: int | None = typer.Option(
        None,
        min=1,
        help="sglang: start an RL rollout server for `glm5 finetune rl --rollout-url` (LoRA adapters up to this "
        "rank, the run's --rank, loaded while it serves).",
    ),
    engine_program: str | None = typer.Option(
        None, help="Run this instead of the engine's own entry point (e.g. a container wrapper)."
    ),
    engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra argument passed to sglang/vLLM (repeat)."),
) -> None:
    """Serve a GLM-5 checkpoint over an OpenAI-compatible HTTP API."""
    api_key = _checked_api_key(api_key)
    if engine is EngineChoice.embedded:
        if dry_run:
            fail("--dry-run prints an sglang/vLLM command; add --engine sglang or --engine vllm", code=EXIT_USAGE)
        _check_embedded_options(model, speculative, quant, dtype)
        vocab = _draft_vocab(draft_vocab, speculative)
        if quant == "int4" and lora is None:
            _warn_merged_int4(Path(model))
        from serve.http import server  # lazily: it loads uvicorn, FastAPI and torch (`glm5 --help` stays fast)

        code = server.run_embedded(
            model_dir=Path(model),
            host=host,
            port=port,
            api_key=api_key,
            served_model_name=served_model_name,
            quant=quant,
            speculative=speculative == "mtp",
            max_num_seqs=max_num_seqs,
            max_queue=max_queue,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            num_draft_tokens=num_draft_tokens,
            dtype=dtype,
            draft_vocab=vocab,
            adapt=_lora_adapt(Path(model), lora, quant) if lora is not None else None,
            max_body_mb=max_body_mb,
            access_log=access_log,
            prefix_caching=prefix_caching,
            lora=lora if quant == "int4" else None,
        )
        raise typer.Exit(code)

    _refuse_embedded_only(quant, draft_vocab, lora)
    if precision == "auto":
        precision = checkpoint_precision(model)
    spec = _external_speculative(model, speculative, hardware)
    opts = ServerOptions(
        model=model,
        host=host,
        port=port,
        served_model_name=served_model_name,
        api_key=api_key,
        max_num_seqs=max_num_seqs,
        extra_args=tuple(engine_arg),
        socket_ifname=socket_ifname,
        rollout_lora_rank=rollout_lora_rank,
        rollout_lora_targets=_rollout_targets() if rollout_lora_rank else (),
    )
    topo = Topology(
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        node_rank=node_rank,
        dist_init_addr=dist_init_addr,
        tp=tp,
        dp=dp,
        ep=ep,
        dp_attention=dp_attention,
        precision=precision,
        speculative=spec,
        spec_steps=num_draft_tokens,
        spec_draft_tokens=num_draft_tokens + 1,
        hardware=hardware,
    )
    from serve.launchers.launch import plan_launch  # lazily: the child-process runner loads httpx

    try:
        plan = plan_launch(engine.value, topo, opts, gpu_memory_gib, engine_program)
    except TopologyError as e:
        fail(str(e), code=EXIT_USAGE)
    if dry_run:
        _print_commands(plan)
        raise typer.Exit(0)
    raise typer.Exit(_run_external(plan))


def _checked_api_key(api_key: str | None) -> str | None:
    """The API key, refused when empty (an empty key would serve with no auth at all, for either engine)."""
    if api_key is None and os.environ.get("GLM5_API_KEY") == "":
        api_key = ""  # typer reads an empty variable as unset: the operator meant a key, and has none
    try:
        check_api_key(api_key)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)
    return api_key


def _check_embedded_options(model: str, speculative: str | None, quant: str | None, dtype: str) -> None:
    if speculative not in (None, "off", "mtp"):
        fail(f"--speculative {speculative!r}: expected mtp or off", code=EXIT_USAGE)
    if quant not in (None, "int4"):
        fail(f"--quant {quant!r}: only int4 is supported", code=EXIT_USAGE)
    if dtype not in ("auto", "float32", "bfloat16"):
        fail(f"--dtype {dtype!r}: expected auto, float32 or bfloat16", code=EXIT_USAGE)
    if not Path(model).is_dir():
        fail(f"{model} is not a checkpoint directory", hint="glm5 model init --preset tiny --out DIR makes one")
    if speculative == "mtp" and not _has_mtp(model, default=True):
        _no_mtp_layer(model)


def _no_mtp_layer(model: str) -> None:
    fail(f"--speculative mtp: {model} has no MTP layer (transformers' save_pretrained writes none)",
         hint="serve it with --speculative off", code=EXIT_USAGE)  # fmt: skip


def _draft_vocab(draft_vocab: Path | None, speculative: str | None) -> tuple[int, ...] | None:
    """The FR-Spec draft vocabulary's token ids, read from `--draft-vocab` (None without it)."""
    if draft_vocab is None:
        return None
    if speculative != "mtp":
        fail("--draft-vocab is for MTP drafts: add --speculative mtp", code=EXIT_USAGE)
    from serve.engine.spec_decode import read_draft_vocab  # lazily: the engine loads torch

    try:
        return read_draft_vocab(draft_vocab)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)


def _lora_adapt(model: Path, lora: Path, quant: str | None) -> Callable:
    """`adapt(model) -> model` for the engine's load: the adapter merged into the weights, or (with --quant int4)
    checked against them and left for the engine to serve beside the INT4 weights. serve does not import
    finetune: the CLI passes this in."""
    if not (lora / "adapter_config.json").is_file():
        fail(f"{lora} is not a LoRA adapter (no adapter_config.json)", code=EXIT_USAGE)
    from finetune.lora import check_base, load_adapter, merge_lora, trained_quant  # lazily: peft and torch

    if trained_quant(lora) == "int4" and quant != "int4":
        err_console.print(
            f"[yellow]warning:[/] {lora} was trained on {model}'s INT4 weights (`glm5 finetune rl --quant "
            f"int4`); served on the full-precision weights it is not the policy it learnt. Add --quant int4.",
            soft_wrap=True,
        )

    def adapt(m):
        if quant == "int4":  # served beside the int4 weights after quantization (load_engine)
            check_base(m, lora)
            err_console.print(f"LoRA adapter {lora}: served beside the INT4 weights", highlight=False)
            return m
        merged = merge_lora(load_adapter(m, lora))
        err_console.print(f"LoRA adapter {lora}: loaded and merged into the weights", highlight=False)
        return merged

    return adapt


def _refuse_embedded_only(quant: str | None, draft_vocab: Path | None, lora: Path | None) -> None:
    if quant:
        fail("--quant applies to the embedded engine; sglang/vLLM read the checkpoint's own quantization")
    if draft_vocab is not None:
        fail("--draft-vocab applies to the embedded engine; pass sglang's own option with --engine-arg")
    if lora is not None:
        fail("--lora applies to the embedded engine; merge the adapter first (`glm5 finetune sft --merge`)")


def _external_speculative(model: str, speculative: str | None, hardware: str) -> str | None:
    """sglang/vLLM's speculative decoding: MTP by default, off (said once) for a checkpoint without the MTP layer."""
    spec = default_speculative(speculative, hardware)
    if spec == "mtp" and not _has_mtp(model, default=True):
        if speculative == "mtp":
            _no_mtp_layer(model)
        spec = None  # the default: speculative decoding off for a checkpoint without the MTP layer
        err_console.print(f"{model} has no MTP layer: speculative decoding off")
    return spec


def _print_commands(plan: Launch) -> None:
    """`--dry-run`: this node's command, or on node 0 of a multi-node launch every node's (to read or paste)."""
    topo = plan.topology
    if topo.nnodes > 1 and topo.node_rank == 0:
        for rank, command in enumerate(plan.node_commands()):
            typer.echo(f"# node {rank}")
            typer.echo(command.display())
    else:
        typer.echo(plan.command().display())


def _run_external(plan: Launch) -> int:
    """Start sglang/vLLM for this node, showing its command and log, and wait for it to exit."""
    try:
        plan.check_installed()
    except EngineNotInstalled as e:
        fail(str(e))
    topo, opts, name = plan.topology, plan.options, plan.engine
    err_console.print(
        f"[bold]starting {name}[/] ({topo.nnodes} node(s) x {topo.gpus_per_node} GPUs, "
        f"{topo.precision}, tp={topo.tp_size} dp={topo.dp} ep={topo.ep}"
        f"{' dp-attention' if topo.dp_attention else ''}{', MTP' if topo.speculative else ''})"
    )
    err_console.print(f"[dim]$[/] {plan.command().display()}", highlight=False, soft_wrap=True)
    served = opts.served_model_name or os.path.basename(opts.model)
    from serve.launchers.launch import run_launch  # loaded already by plan_launch's import

    return run_launch(
        plan,
        log=lambda line: console.out(f"{name}| {line}", highlight=False),
        on_ready=lambda: err_console.print(f"[bold green]ready[/] http://{opts.host}:{opts.port}/v1 (model {served})"),
    )


def _rollout_targets() -> tuple[str, ...]:
    """The modules `glm5 finetune rl` puts its adapter on (finetune.grpo.RL_TARGETS), by sglang's names."""
    from finetune.grpo import RL_TARGETS  # lazily: finetune loads torch and peft

    return tuple(RL_TARGETS)


def _has_mtp(model: str, default: bool) -> bool:
    """Whether a local checkpoint directory holds its MTP layer; `default` when that cannot be read (a hub id)."""
    from model.checkpoint import checkpoint_has_mtp  # lazily: model loads torch

    try:
        return checkpoint_has_mtp(model) if Path(model).is_dir() else default
    except (OSError, ValueError):
        return default


def _warn_merged_int4(model: Path) -> None:
    """`finetune sft/rl/distill --merge` leave the adapter they merged in MODEL/adapter. INT4 rounds every weight
    anew (~10% of its size): for a small adapter (RL's, a few % of the weights' size) the rounding moves the served
    weights further than the adapter did, in no direction it chose (benchmarks/RESULTS.md, "Why RL's held-out
    differences were mostly rounding"). Say so, and how to keep the change exact: `--quant int4 --lora` serves
    the adapter beside the int4 weights (serve.http.weight_updates.attach_lora)."""
    record = model / "adapter" / "adapter_base.json"
    if not record.is_file():
        return
    try:
        base = json.loads(record.read_text()).get("base_model_name_or_path") or "BASE"
    except (OSError, ValueError):
        base = "BASE"
    err_console.print(
        f"[yellow]warning:[/] {model} has a LoRA adapter merged into its weights ({model / 'adapter'}); rounding "
        "them to INT4 anew can move them further than a small adapter (an RL run's) did. To keep the adapter's "
        f"change exact: glm5 serve {base} --quant int4 --lora {model / 'adapter'}",
        soft_wrap=True,
    )
