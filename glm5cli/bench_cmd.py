"""`glm5 bench`: agentic benchmarks (SWE-bench, Harbor / Terminal-Bench) and serving load tests.

    swe / terminal   run tasks with an agent into a run folder (resumable; reports, JUnit, markdown)
    validate         the oracle solves every task, nop none
    proof            the training proof: base -> SFT -> RL, each stage benched on held-out (glm5cli/proof_cmd.py)
    report / compare merge shards into one report; two runs side by side
    serve            load-test an OpenAI-compatible server
The work happens in agent/bench (and serve/bench); these commands parse flags and show results.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import typer

from glm5cli.bench_harness import compare_with_harness
from glm5cli.bench_run import EXIT_BELOW, MIN_RESOLVED_HELP, command, gate, show
from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json
from glm5cli.help_format import WholeSummaries

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, cls=WholeSummaries)  # plain help (glm5cli/app.py)


# -- agentic benchmarks: swe and terminal share their flags (glm5cli/bench_run.py) --------------------------------

app.command("swe")(command("swe"))
app.command("terminal")(command("terminal"))


@app.command("validate")
def validate(
    paths: list[Path] = typer.Argument(None, help="A SWE tasks file, or Harbor task folders.", show_default=False),
    suite: str = typer.Option(None, "--suite", help="Validate a named suite (builtin)."),
    kind: str = typer.Option(
        None,
        "--kind",
        metavar="<swe|terminal>",
        help="swe or terminal (default: guessed from the paths).",
    ),
    work: Path = typer.Option(None, "--work", help="Where the trials go (default: a temporary folder)."),
    n: int = typer.Option(1, "-n", help="Tasks checked at once."),
    env: str = typer.Option("local", "--env", metavar="<local|docker>", help="local or docker."),
    repos: Path = typer.Option(None, "--repos", help="Folder of local clones for owner/name repos."),
    as_json: bool = typer.Option(False, "--json", help="Print {task: [problems]} as JSON."),
) -> None:
    """Check tasks: the oracle solves each, nop none; each FAIL_TO_PASS test fails before the gold patch."""
    # agent/bench is imported here, not at the top: `glm5 --help` must not pay for it
    from agent.bench.tasks import TaskError
    from agent.bench.validate import validate_kinds

    paths = list(paths or [])
    if kind is None and suite and not paths:
        kinds = ["swe", "terminal"]  # a named suite of both kinds: validate both
    elif kind is None:
        kinds = ["terminal" if paths and all(p.is_dir() for p in paths) else "swe"]
    else:
        kinds = [kind]
    if any(k not in ("swe", "terminal") for k in kinds):
        fail("--kind must be swe or terminal", code=EXIT_USAGE)
    temporary = work is None
    work = work or Path(tempfile.mkdtemp(prefix="glm5-validate-"))

    def done(tid, found):
        if not as_json:
            mark = "[green]ok[/]    " if not found else "[red]broken[/]"
            err_console.print(f"{mark} {tid}" + "".join(f"\n         - {p}" for p in found), highlight=False)

    try:
        found = validate_kinds(kinds, paths, suite, work, env=env, concurrency=n, repos_dir=repos, on_done=done)
    except (TaskError, FileExistsError) as e:
        fail(str(e), code=EXIT_USAGE)
    broken = {t: p for t, p in found.items() if p}
    if temporary and not broken:
        shutil.rmtree(work, ignore_errors=True)  # nothing to look at: the trials of a temporary folder go
    kept = str(work) if work.exists() else None
    if as_json:
        print_json({"tasks": len(found), "broken": broken, "work": kept})
    else:
        console.print(f"{len(found) - len(broken)} of {len(found)} tasks valid"
                      + (f"; trials in {kept}" if kept else ""))  # fmt: skip
    if broken:
        raise typer.Exit(EXIT_BELOW)


@app.command("report")
def report(
    runs: list[Path] = typer.Argument(..., help="Run folders (the shards of one run are merged)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    junit: Path = typer.Option(None, "--junit", help="Write the JUnit XML here."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the markdown summary (for $GITHUB_STEP_SUMMARY)."),
    out: Path = typer.Option(None, "--out", help="Write report.json, junit.xml, summary.md into this folder."),
    min_resolved: float = typer.Option(None, "--min-resolved", min=0.0, max=1.0, help=MIN_RESOLVED_HELP),
) -> None:
    """Rebuild the report of one run, or merge the folders of a sharded run into the report one job would write."""
    from agent.bench.reports import build_report, junit_xml, write_reports  # here, not at the top: --help's speed
    from agent.bench.reports import markdown as to_markdown
    from agent.bench.run_folder import RunFolderError

    try:
        rep = build_report(runs)
    except (RunFolderError, OSError) as e:
        fail(str(e), code=EXIT_USAGE)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        write_reports(out, rep)
    if junit:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(junit_xml(rep), encoding="utf-8")
    if markdown:
        sys.stdout.write(to_markdown(rep) + "\n")
    elif as_json:
        print_json(rep)
    else:
        show(rep, False, out)
    gate(rep, min_resolved)


@app.command("compare")
def compare(
    run_a: Path = typer.Argument(..., help="The baseline run folder."),
    run_b: Path = typer.Argument(..., help="The run compared with it, or the SWE-bench harness's report of the "
                                 "same tasks (<model>.<run_id>.json): glm5's grades checked against it."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Per-task flips between two runs and the paired difference in resolved rate (B - A), with a 95% interval."""
    from agent.bench.reports import compare as cmp  # here, not at the top: --help's speed
    from agent.bench.run_folder import RunFolderError

    if run_b.is_file():
        compare_with_harness(run_a, run_b, as_json)
        return

    try:
        c = cmp([run_a], [run_b])
    except (RunFolderError, OSError) as e:
        fail(str(e), code=EXIT_USAGE)
    if as_json:
        print_json(c)
        return
    d = c["difference"]

    def pct(x):
        return "n/a" if x is None else f"{100 * x:+.1f} pts"

    ra, rb = c["a"]["summary"]["resolved_rate"], c["b"]["summary"]["resolved_rate"]
    console.print(f"A {run_a}: resolved rate {'n/a' if ra is None else f'{100 * ra:.1f}%'}")
    console.print(f"B {run_b}: resolved rate {'n/a' if rb is None else f'{100 * rb:.1f}%'}")
    ci = d["ci95"]
    console.print(f"B - A over {d['tasks_compared']} tasks: {pct(d['mean_difference'])}"
                  + (f" (95% CI {pct(ci[0])} to {pct(ci[1])})" if ci else ""))  # fmt: skip
    for name, ids in (("gained (B only)", d["gained"]), ("lost (A only)", d["lost"])):
        if ids:
            console.print(f"{name}: {', '.join(ids)}", highlight=False)
    t = c["trials"]
    if t["compared"]:
        line = f"trials in both: {t['compared']}, outcomes alike {t['outcomes_alike']}"
        if t["sessions_compared"]:
            line += f", sessions alike call for call {t['sessions_alike']} of {t['sessions_compared']}"
        console.print(line)


@app.command("serve")
def serve(
    base_url: str = typer.Option(..., help="The server, e.g. http://127.0.0.1:8000 (any OpenAI-compatible one)."),
    dataset: str = typer.Option("random", metavar="<random|shared-prefix>", help="Prompts: random, or shared-prefix."),
    num_prompts: int = typer.Option(32, help="Requests to send (random dataset)."),
    request_rate: float = typer.Option(float("inf"), help="Requests per second, Poisson arrivals; inf = burst."),
    max_concurrency: int | None = typer.Option(None, help="Most requests in flight at once."),
    api: str = typer.Option(
        "completions",
        metavar="<completions|chat>",
        help="completions (/v1/completions) or chat (/v1/chat/completions).",
    ),
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
    # asyncio and serve/bench here, not at the top: --help's speed
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


# -- the training proof (its own module: glm5cli/proof_cmd.py) --------------------------------------------------

from glm5cli.proof_cmd import proof as _proof  # noqa: E402

app.command("proof")(_proof)
