"""`glm5 bench`: agentic and serving benchmarks."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, fail, not_built, print_json

app = typer.Typer(no_args_is_help=True)


@app.command("swe")
def swe() -> None:
    """Run SWE-bench-format tasks with the agent."""
    not_built("bench swe")


@app.command("serve")
def serve(
    base_url: str = typer.Option(..., help="The server, e.g. http://127.0.0.1:8000 (any OpenAI-compatible one)."),
    dataset: str = typer.Option("random", help="random | shared-prefix"),
    num_prompts: int = typer.Option(32, help="Requests to send (random dataset)."),
    request_rate: float = typer.Option(float("inf"), help="Requests per second, Poisson arrivals; inf = burst."),
    max_concurrency: int | None = typer.Option(None, help="Most requests in flight at once."),
    api: str = typer.Option("completions", help="completions (/v1/completions) or chat (/v1/chat/completions)."),
    model: str | None = typer.Option(None, help="Model name (default: the first one /v1/models lists)."),
    api_key: str | None = typer.Option(None, envvar=["GLM5_API_KEY", "OPENAI_API_KEY"], help="Bearer token."),
    random_input_len: int = typer.Option(256, help="Prompt length in tokens (random)."),
    random_output_len: int = typer.Option(64, help="Tokens to generate (random)."),
    random_range_ratio: float = typer.Option(1.0, help="Lengths drawn uniformly between len * ratio and len."),
    gsp_num_groups: int = typer.Option(4, help="Shared-prefix groups."),
    gsp_prompts_per_group: int = typer.Option(8, help="Prompts per shared prefix."),
    gsp_system_prompt_len: int = typer.Option(512, help="Shared system prompt length in tokens."),
    gsp_question_len: int = typer.Option(64, help="Question length in tokens."),
    gsp_output_len: int = typer.Option(64, help="Tokens to generate (shared-prefix)."),
    disable_stream: bool = typer.Option(False, "--disable-stream", help="Non-streaming requests (no TTFT/ITL)."),
    disable_ignore_eos: bool = typer.Option(False, "--disable-ignore-eos", help="Let requests stop at EOS."),
    warmup_requests: int = typer.Option(1, help="Requests sent (and not measured) before the run."),
    seed: int = typer.Option(0, help="Seed for prompts and arrival times."),
    goodput: str | None = typer.Option(None, help="SLOs for goodput, in ms: 'ttft:500 tpot:50 e2el:2000'."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of a table."),
    output_file: Path | None = typer.Option(None, help="Append the summary as one JSON line to this file."),
) -> None:
    """Load-test an OpenAI-compatible server (sglang bench_serving semantics)."""
    import asyncio

    from serve.bench.dataset import random_dataset, shared_prefix_dataset
    from serve.bench.metrics import parse_slos
    from serve.bench.report import append_jsonl, summary_table
    from serve.bench.runner import BenchConfig, BenchError, run_benchmark

    try:
        slos = parse_slos(goodput)
    except ValueError as e:
        fail(str(e), code=EXIT_USAGE)

    if dataset == "random":
        requests = random_dataset(num_prompts, random_input_len, random_output_len, random_range_ratio, seed)
    elif dataset == "shared-prefix":
        requests = shared_prefix_dataset(
            gsp_num_groups, gsp_prompts_per_group, gsp_system_prompt_len, gsp_question_len, gsp_output_len, seed
        )
    else:
        fail(f"--dataset {dataset!r}: expected random or shared-prefix", code=EXIT_USAGE)
    if api not in ("completions", "chat"):
        fail(f"--api {api!r}: expected completions or chat", code=EXIT_USAGE)
    if request_rate <= 0 or (max_concurrency is not None and max_concurrency < 1):
        fail("--request-rate must be > 0 and --max-concurrency >= 1", code=EXIT_USAGE)
    config = BenchConfig(
        base_url=base_url,
        api=api,
        model=model,
        api_key=api_key,
        request_rate=request_rate,
        max_concurrency=max_concurrency,
        stream=not disable_stream,
        ignore_eos=not disable_ignore_eos,
        warmup_requests=warmup_requests,
        seed=seed,
        slos=tuple(slos.items()),
    )
    try:
        summary = asyncio.run(run_benchmark(config, requests))
    except BenchError as e:
        fail(str(e))
    summary["dataset"] = dataset
    if output_file:
        append_jsonl(summary, output_file)
    if as_json:
        print_json(summary)
    else:
        console.print(summary_table(summary))
    if summary["completed"] == 0:
        fail(f"every request failed: {summary['errors']}")
