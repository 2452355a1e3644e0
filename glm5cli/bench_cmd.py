"""`glm5 bench`: agentic benchmarks (SWE-bench, Harbor / Terminal-Bench) and serving load tests.

    swe / terminal   run tasks with an agent into a run folder (resumable; reports, JUnit, markdown)
    validate         the oracle solves every task, nop none
    proof            the training proof: base -> SFT -> RL, each stage benched on held-out (glm5cli/proof_cmd.py)
    report / compare merge shards into one report; two runs side by side
    serve            load-test an OpenAI-compatible server
The work happens in agent/bench (and serve/bench); these commands parse flags and show results.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json
from glm5cli.help_format import WholeSummaries
from glm5cli.progress import BenchProgress as _Progress

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, cls=WholeSummaries)  # plain help (glm5cli/app.py)


# -- agentic benchmarks ----------------------------------------------------------------------------------------

TASKS_HELP = "SWE-bench-format tasks: JSONL, JSON or parquet (instance_id, repo, base_commit, FAIL_TO_PASS, ...)."
EXIT_BELOW = 1  # --min-resolved not met
SEED_HELP = ("glm5 agent: sampling seed. Every request of attempt A at task T carries a seed drawn from (SEED, T, A) "
             "and its turn (OpenAI's `seed`; glm5 serve, vLLM and sglang honor it): the same sessions again, and two "
             "checkpoints benched with the same seed meet the same random draws, so `bench compare` sees their "
             "difference and less luck. Default: the server's own draws.")  # fmt: skip


def _run(kind: str, paths: list[Path], out: Path, agent: str, k: int, n: int, shard: str, filter_: str | None,
         env: str, max_turns: int, timeout: float | None, retries: int, junit: Path | None, as_json: bool,
         base_url: str | None, model: str | None, provider: str | None, api_key_env: str | None,
         repos: Path | None, suite: str | None, force: bool, min_resolved: float | None, test_timeout: float,
         max_cost: float | None, memory_mb: int | None, temperature: float | None, keep_workdirs: bool,
         flaky_reruns: int = 0, agent_profile: str | None = None,
         retry_infra_errors: bool = False, seed: int | None = None,
         predictions: Path | None = None) -> None:  # fmt: skip
    from agent.bench.agents import AgentLimits, make_agent
    from agent.bench.job import load_tasks, run_job
    from agent.bench.run_folder import RunFolderError
    from agent.bench.runner import RunOptions, parse_shard
    from agent.bench.tasks import TaskError

    out = out.resolve()  # every trial and the repository cache live under it, whatever folder git runs in
    from agent.settings import SettingsError

    if k < 1 or n < 1 or retries < 0:
        fail("-k and -n must be >= 1 and --retries >= 0", code=EXIT_USAGE)
    if env not in ("local", "docker"):
        from agent.bench.environments import environment_kinds

        if env not in environment_kinds():
            fail(f"--env {env!r}: expected local, docker or a plugin's environment", code=EXIT_USAGE)
    try:
        tasks, source, base_dir = load_tasks(kind, paths, suite, out / "suite")
        if env == "local":
            from glm5cli.bench_harness import check_local

            check_local(tasks, parse_shard(shard), filter_)
        bench_agent = make_agent(agent, base_url=base_url, model=model, provider=provider, api_key_env=api_key_env,
                                 temperature=temperature, profile=agent_profile, seed=seed) if agent == "glm5" \
            else make_agent(agent)  # fmt: skip
        options = RunOptions(k=k, concurrency=n, shard=parse_shard(shard), filter=filter_, env=env, retries=retries,
                             limits=AgentLimits(max_turns, timeout, max_cost, memory_mb), test_timeout_s=test_timeout,
                             keep_workdirs=keep_workdirs, repos_dir=repos, base_dir=base_dir, force=force,
                             flaky_reruns=flaky_reruns, source=source,
                             retry_infra_errors=retry_infra_errors)  # fmt: skip
        with _Progress(kind) as progress:
            report = run_job(kind, tasks, bench_agent, out, options, junit, progress.event)
        if predictions is not None:
            from glm5cli.bench_harness import write_predictions

            write_predictions(out, predictions)
    except (TaskError, ValueError, RunFolderError, SettingsError, FileExistsError) as e:
        fail(str(e), code=EXIT_USAGE)
    except KeyboardInterrupt:
        fail(f"interrupted; rerun the same command to resume (finished trials are kept in {out})", code=130)
    _show(report, as_json, out)
    infra = report["summary"]["infra_errors"]
    if infra and not as_json:
        err_console.print(f"{infra} trial(s) ended in an infrastructure error and are not scored; once the cause is "
                          "fixed, rerun the same command with --retry-infra-errors to run them again", style="yellow")  # fmt: skip
    _gate(report, min_resolved)


def _gate(report: dict, min_resolved: float | None) -> None:
    """--min-resolved: exit 1, saying why, when the run's resolved rate is below it."""
    from agent.bench.job import below

    if below(report, min_resolved):
        rate = report["summary"]["resolved_rate"]
        fail(f"resolved rate {'n/a' if rate is None else f'{rate:.3f}'} is below --min-resolved {min_resolved}",
             code=EXIT_BELOW)  # fmt: skip


def _show(report: dict, as_json: bool, out: Path | None) -> None:
    if as_json:
        print_json({"summary": report["summary"], "report": str(out / "report.json") if out else None,
                    "complete": report["complete"], "runs": report["runs"]})  # fmt: skip
        return
    from rich.table import Table

    s, k = report["summary"], report["k"]
    t = Table(title=f"glm5 bench {report['kind']}: {(report.get('agent') or {}).get('agent')}", show_header=False)

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    ci = s["resolved_rate_ci95"]
    t.add_row("resolved", f"{s['resolved']}/{s['graded']} ({pct(s['resolved_rate'])}"
              + (f", 95% CI {pct(ci[0])}-{pct(ci[1])})" if ci else ")"))  # fmt: skip
    t.add_row("pass@1", pct(s["pass@1"]))
    if k > 1:
        t.add_row(f"pass@{k}", pct(s.get(f"pass@{k}")))
    t.add_row("infra errors (not scored)", str(s["infra_errors"]))
    t.add_row("not run", str(s["not_run"]))
    t.add_row("tokens", f"{s['prompt_tokens']} prompt / {s['completion_tokens']} completion")
    t.add_row("cost", f"${s['cost_usd']:.4f}")
    t.add_row("time per trial", f"{s['seconds_per_trial']} s" if s["seconds_per_trial"] is not None else "n/a")
    console.print(t)
    for tid, task in report["tasks"].items():
        if task["status"] != "resolved":
            why = next((a.get("reason") for a in reversed(task["attempts"]) if a.get("reason")), "") or ""
            console.print(f"  [yellow]{task['status']:<12}[/] {tid}  {why[:120]}", highlight=False)
    if out:
        console.print(
            f"[dim]report: {out / 'report.json'}  junit: {out / 'junit.xml'}  summary: {out / 'summary.md'}[/]"
        )


@app.command("swe")
def swe(
    tasks: list[Path] = typer.Argument(None, help=TASKS_HELP, show_default=False),
    out: Path = typer.Option(..., "--out", "-o", help="The run folder (resumes when it holds this run)."),
    agent: str = typer.Option(
        "glm5",
        "--agent",
        metavar="<glm5|oracle|nop|cmd:COMMAND>",
        help='glm5, oracle, nop, or cmd:"COMMAND" (task on stdin, $GLM5_TASK).',
    ),
    k: int = typer.Option(1, "-k", help="Attempts per task (pass@k)."),
    n: int = typer.Option(1, "-n", help="Trials run at once."),
    shard: str = typer.Option("1/1", "--shard", help="Run shard I of N (CI matrix); `bench report` merges them."),
    filter_: str = typer.Option(None, "--filter", help="Only tasks whose id matches this regular expression."),
    env: str = typer.Option(
        "local",
        "--env",
        metavar="<local|docker>",
        help="local (bubblewrap, no Docker) or docker.",
    ),
    max_turns: int = typer.Option(100, "--max-turns", help="Model calls per trial."),
    timeout: float = typer.Option(None, "--timeout", help="Wall-time limit of the agent per trial, seconds."),
    retries: int = typer.Option(1, "--retries", help="Retries of a trial that hit an infrastructure error."),
    retry_infra_errors: bool = typer.Option(
        False,
        "--retry-infra-errors",
        help="On resume, run again the trials whose every try ended in an infrastructure error (an endpoint that "
        "was down, say); without it a resume keeps them as they are.",
    ),
    junit: Path = typer.Option(None, "--junit", help="Also write the JUnit XML here (always in RUN/junit.xml)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    base_url: str = typer.Option(None, "--base-url", help="glm5 agent: OpenAI-compatible endpoint."),
    model: str = typer.Option(None, "--model", help="glm5 agent: model name."),
    provider: str = typer.Option(None, "--provider", help="glm5 agent: a named provider from the config file."),
    api_key_env: str = typer.Option(None, "--api-key-env", help="glm5 agent: variable holding the API key."),
    repos: Path = typer.Option(None, "--repos", help="Folder of local clones for owner/name repos (offline CI)."),
    suite: str = typer.Option(None, "--suite", help="A named suite instead of TASKS (builtin)."),
    force: bool = typer.Option(False, "--force", help="Resume even though the config changed."),
    min_resolved: float = typer.Option(
        None, "--min-resolved", min=0.0, max=1.0, help="Exit 1 when the resolved rate (0-1, e.g. 0.5) is below this."
    ),
    test_timeout: float = typer.Option(1800.0, "--test-timeout", help="Seconds for the graded test run."),
    max_cost: float = typer.Option(None, "--max-cost", help="USD per trial (glm5 agent)."),
    memory_mb: int = typer.Option(None, "--memory-mb", help="Memory limit per command, MB."),
    temperature: float = typer.Option(None, "--temperature", help="glm5 agent: sampling temperature."),
    seed: int = typer.Option(None, "--seed", min=0, help=SEED_HELP),
    keep_workdirs: bool = typer.Option(False, "--keep-workdirs", help="Keep each trial's checkouts."),
    flaky_reruns: int = typer.Option(
        0,
        "--flaky-reruns",
        help="Reruns of a failing test run; a test that passes in one counts as passed and is "
        "named flaky. Off by default, as in the SWE-bench harness: an agent's code can pass on a rerun on purpose.",
    ),
    agent_profile: str = typer.Option(
        None,
        "--agent-profile",
        metavar="<full|compact>",
        help="glm5 agent: full (default) or compact (read, edit, bash, glob and a short prompt: for small models).",
    ),
    predictions: Path = typer.Option(None, "--predictions", help="Also write the SWE-bench harness's predictions "
                                     "JSONL here (each task's first attempt), for `swebench eval -p`."),
) -> None:
    """Run SWE-bench-format tasks with an agent; grade them as the SWE-bench harness does.

    Example: glm5 bench swe --suite builtin --out runs/base --base-url http://127.0.0.1:8000/v1 -n 4
    """
    _run("swe", list(tasks or []), out, agent, k, n, shard, filter_, env, max_turns, timeout, retries, junit, as_json,
         base_url, model, provider, api_key_env, repos, suite, force, min_resolved, test_timeout, max_cost, memory_mb,
         temperature, keep_workdirs, flaky_reruns, agent_profile, retry_infra_errors, seed, predictions)  # fmt: skip


@app.command("terminal")
def terminal(
    task_dirs: list[Path] = typer.Argument(
        None, help="Harbor / Terminal-Bench 2.0 task folders (or folders of them).", show_default=False
    ),  # fmt: skip
    out: Path = typer.Option(..., "--out", "-o", help="The run folder (resumes when it holds this run)."),
    agent: str = typer.Option(
        "glm5",
        "--agent",
        metavar="<glm5|oracle|nop|cmd:COMMAND>",
        help='glm5, oracle, nop, or cmd:"COMMAND" (task on stdin, $GLM5_TASK).',
    ),
    k: int = typer.Option(1, "-k", help="Attempts per task (pass@k)."),
    n: int = typer.Option(1, "-n", help="Trials run at once."),
    shard: str = typer.Option("1/1", "--shard", help="Run shard I of N (CI matrix); `bench report` merges them."),
    filter_: str = typer.Option(None, "--filter", help="Only tasks whose name matches this regular expression."),
    env: str = typer.Option(
        "local",
        "--env",
        metavar="<local|docker>",
        help="local (bubblewrap, no Docker) or docker.",
    ),
    max_turns: int = typer.Option(100, "--max-turns", help="Model calls per trial."),
    timeout: float = typer.Option(None, "--timeout", help="Agent wall time per trial (default: task.toml's)."),
    retries: int = typer.Option(1, "--retries", help="Retries of a trial that hit an infrastructure error."),
    retry_infra_errors: bool = typer.Option(
        False,
        "--retry-infra-errors",
        help="On resume, run again the trials whose every try ended in an infrastructure error (an endpoint that "
        "was down, say); without it a resume keeps them as they are.",
    ),
    junit: Path = typer.Option(None, "--junit", help="Also write the JUnit XML here (always in RUN/junit.xml)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    base_url: str = typer.Option(None, "--base-url", help="glm5 agent: OpenAI-compatible endpoint."),
    model: str = typer.Option(None, "--model", help="glm5 agent: model name."),
    provider: str = typer.Option(None, "--provider", help="glm5 agent: a named provider from the config file."),
    api_key_env: str = typer.Option(None, "--api-key-env", help="glm5 agent: variable holding the API key."),
    suite: str = typer.Option(None, "--suite", help="A named suite instead of TASK_DIR (builtin)."),
    force: bool = typer.Option(False, "--force", help="Resume even though the config changed."),
    min_resolved: float = typer.Option(
        None, "--min-resolved", min=0.0, max=1.0, help="Exit 1 when the resolved rate (0-1, e.g. 0.5) is below this."
    ),
    max_cost: float = typer.Option(None, "--max-cost", help="USD per trial (glm5 agent)."),
    memory_mb: int = typer.Option(None, "--memory-mb", help="Memory limit per command, MB."),
    temperature: float = typer.Option(None, "--temperature", help="glm5 agent: sampling temperature."),
    seed: int = typer.Option(None, "--seed", min=0, help=SEED_HELP),
    keep_workdirs: bool = typer.Option(False, "--keep-workdirs", help="Keep each trial's /app."),
    agent_profile: str = typer.Option(
        None,
        "--agent-profile",
        metavar="<full|compact>",
        help="glm5 agent: full (default) or compact (read, edit, bash, glob and a short prompt: for small models).",
    ),
) -> None:
    """Run Harbor / Terminal-Bench 2.0 tasks with an agent; the verifier's reward file is the score.

    Example: glm5 bench terminal path/to/tasks/ --out runs/tb --agent oracle   (checks the tasks' solutions)
    """
    _run("terminal", list(task_dirs or []), out, agent, k, n, shard, filter_, env, max_turns, timeout, retries, junit,
         as_json, base_url, model, provider, api_key_env, None, suite, force, min_resolved, 1800.0, max_cost,
         memory_mb, temperature, keep_workdirs, 1, agent_profile, retry_infra_errors, seed)  # fmt: skip


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
    import shutil
    import tempfile

    from agent.bench.job import load_tasks
    from agent.bench.tasks import TaskError
    from agent.bench.validate import validate as check

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

    found: dict = {}
    for k in kinds:
        try:
            tasks, _, base_dir = load_tasks(k, paths, suite, work / k / "suite")
        except (TaskError, FileExistsError) as e:
            if len(kinds) > 1 and "no " in str(e) and "suite named" in str(e):
                continue  # the suite has no tasks of this kind
            fail(str(e), code=EXIT_USAGE)
        found |= check(tasks, work / k, env=env, concurrency=n, repos_dir=repos, base_dir=base_dir, on_done=done)
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
    min_resolved: float = typer.Option(
        None, "--min-resolved", min=0.0, max=1.0, help="Exit 1 when the resolved rate (0-1, e.g. 0.5) is below this."
    ),
) -> None:
    """Rebuild the report of one run, or merge the folders of a sharded run into the report one job would write."""
    from agent.bench.reports import build_report, junit_xml, write_reports
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
        _show(rep, False, out)
    _gate(rep, min_resolved)


@app.command("compare")
def compare(
    run_a: Path = typer.Argument(..., help="The baseline run folder."),
    run_b: Path = typer.Argument(..., help="The run compared with it, or the SWE-bench harness's report of the "
                                 "same tasks (<model>.<run_id>.json): glm5's grades checked against it."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Per-task flips between two runs and the paired difference in resolved rate (B - A), with a 95% interval."""
    from agent.bench.reports import compare as cmp
    from agent.bench.run_folder import RunFolderError

    if run_b.is_file():
        from glm5cli.bench_harness import compare_with_harness

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
