"""`glm5 bench swe` and `glm5 bench terminal`: their flags, declared once, and what the CLI does with them.

OPTIONS is the table of both commands' flags in --help's order, each row naming the kinds that take it (a flag whose
help differs by kind has a row per kind); `command(kind)` makes the Typer command of a kind from it, and the flags
arrive as one RunFlags. `run` turns them into agent/bench's objects (the tasks, the agent, RunOptions), runs the
job (agent/bench/job.py), shows the report and gates on --min-resolved; `show` and `gate` serve `bench report` too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from glm5cli.bench_harness import check_local, write_predictions
from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json
from glm5cli.progress import BenchProgress

TASKS_HELP = "SWE-bench-format tasks: JSONL, JSON or parquet (instance_id, repo, base_commit, FAIL_TO_PASS, ...)."
EXIT_BELOW = 1  # --min-resolved not met
SEED_HELP = ("glm5 agent: sampling seed. Every request of attempt A at task T carries a seed drawn from (SEED, T, A) "
             "and its turn (OpenAI's `seed`; glm5 serve, vLLM and sglang honor it): the same sessions again, and two "
             "checkpoints benched with the same seed meet the same random draws, so `bench compare` sees their "
             "difference and less luck. Default: the server's own draws.")  # fmt: skip
MIN_RESOLVED_HELP = "Exit 1 when the resolved rate (0-1, e.g. 0.5) is below this."
DOCS = {
    "swe": """Run SWE-bench-format tasks with an agent; grade them as the SWE-bench harness does.

    Example: glm5 bench swe --suite builtin --out runs/base --base-url http://127.0.0.1:8000/v1 -n 4
    """,
    "terminal": """Run Harbor / Terminal-Bench 2.0 tasks with an agent; the verifier's reward file is the score.

    Example: glm5 bench terminal path/to/tasks/ --out runs/tb --agent oracle   (checks the tasks' solutions)
    """,
}


@dataclass
class RunFlags:
    """The flags of one `glm5 bench swe|terminal` run, parsed (a kind without a flag gets the default here)."""

    paths: list[Path]
    out: Path
    agent: str = "glm5"
    k: int = 1
    n: int = 1
    shard: str = "1/1"
    filter_: str | None = None
    env: str = "local"
    max_turns: int = 100
    timeout: float | None = None
    retries: int = 1
    retry_infra_errors: bool = False
    junit: Path | None = None
    as_json: bool = False
    base_url: str | None = None
    model: str | None = None
    provider: str | None = None
    api_key_env: str | None = None
    repos: Path | None = None
    suite: str | None = None
    force: bool = False
    min_resolved: float | None = None
    test_timeout: float = 1800.0
    max_cost: float | None = None
    memory_mb: int | None = None
    temperature: float | None = None
    seed: int | None = None
    keep_workdirs: bool = False
    flaky_reruns: int = 0
    agent_profile: str | None = None
    predictions: Path | None = None


# what a kind without the flag runs with, where that is not RunFlags' default
FIXED = {"terminal": {"flaky_reruns": 1}}


@dataclass(frozen=True)
class Flag:
    """One row of OPTIONS: the parameter, its type, the kinds that take it, how Typer declares it."""

    name: str
    type: Any
    declare: Callable[[], Any]
    kinds: tuple[str, ...] = ("swe", "terminal")


OPTIONS = (
    Flag("tasks", list[Path], lambda: typer.Argument(None, help=TASKS_HELP, show_default=False), ("swe",)),
    Flag("task_dirs", list[Path], lambda: typer.Argument(
        None, help="Harbor / Terminal-Bench 2.0 task folders (or folders of them).", show_default=False), ("terminal",)),
    Flag("out", Path, lambda: typer.Option(..., "--out", "-o", help="The run folder (resumes when it holds this run).")),
    Flag("agent", str, lambda: typer.Option("glm5", "--agent", metavar="<glm5|oracle|nop|cmd:COMMAND>",
                                            help='glm5, oracle, nop, or cmd:"COMMAND" (task on stdin, $GLM5_TASK).')),
    Flag("k", int, lambda: typer.Option(1, "-k", help="Attempts per task (pass@k).")),
    Flag("n", int, lambda: typer.Option(1, "-n", help="Trials run at once.")),
    Flag("shard", str, lambda: typer.Option(
        "1/1", "--shard", help="Run shard I of N (CI matrix); `bench report` merges them.")),
    Flag("filter_", str, lambda: typer.Option(
        None, "--filter", help="Only tasks whose id matches this regular expression."), ("swe",)),
    Flag("filter_", str, lambda: typer.Option(
        None, "--filter", help="Only tasks whose name matches this regular expression."), ("terminal",)),
    Flag("env", str, lambda: typer.Option("local", "--env", metavar="<local|docker>",
                                          help="local (bubblewrap, no Docker) or docker.")),
    Flag("max_turns", int, lambda: typer.Option(100, "--max-turns", help="Model calls per trial.")),
    Flag("timeout", float, lambda: typer.Option(
        None, "--timeout", help="Wall-time limit of the agent per trial, seconds."), ("swe",)),
    Flag("timeout", float, lambda: typer.Option(
        None, "--timeout", help="Agent wall time per trial (default: task.toml's)."), ("terminal",)),
    Flag("retries", int, lambda: typer.Option(1, "--retries", help="Retries of a trial that hit an infrastructure error.")),
    Flag("retry_infra_errors", bool, lambda: typer.Option(
        False, "--retry-infra-errors",
        help="On resume, run again the trials whose every try ended in an infrastructure error (an endpoint that "
        "was down, say); without it a resume keeps them as they are.")),
    Flag("junit", Path, lambda: typer.Option(
        None, "--junit", help="Also write the JUnit XML here (always in RUN/junit.xml).")),
    Flag("as_json", bool, lambda: typer.Option(False, "--json", help="Print the summary as JSON on stdout.")),
    Flag("base_url", str, lambda: typer.Option(None, "--base-url", help="glm5 agent: OpenAI-compatible endpoint.")),
    Flag("model", str, lambda: typer.Option(None, "--model", help="glm5 agent: model name.")),
    Flag("provider", str, lambda: typer.Option(
        None, "--provider", help="glm5 agent: a named provider from the config file.")),
    Flag("api_key_env", str, lambda: typer.Option(
        None, "--api-key-env", help="glm5 agent: variable holding the API key.")),
    Flag("repos", Path, lambda: typer.Option(
        None, "--repos", help="Folder of local clones for owner/name repos (offline CI)."), ("swe",)),
    Flag("suite", str, lambda: typer.Option(
        None, "--suite", help="A named suite instead of TASKS (builtin)."), ("swe",)),
    Flag("suite", str, lambda: typer.Option(
        None, "--suite", help="A named suite instead of TASK_DIR (builtin)."), ("terminal",)),
    Flag("force", bool, lambda: typer.Option(False, "--force", help="Resume even though the config changed.")),
    Flag("min_resolved", float, lambda: typer.Option(None, "--min-resolved", min=0.0, max=1.0, help=MIN_RESOLVED_HELP)),
    Flag("test_timeout", float, lambda: typer.Option(
        1800.0, "--test-timeout", help="Seconds for the graded test run."), ("swe",)),
    Flag("max_cost", float, lambda: typer.Option(None, "--max-cost", help="USD per trial (glm5 agent).")),
    Flag("memory_mb", int, lambda: typer.Option(None, "--memory-mb", help="Memory limit per command, MB.")),
    Flag("temperature", float, lambda: typer.Option(
        None, "--temperature", help="glm5 agent: sampling temperature.")),
    Flag("seed", int, lambda: typer.Option(None, "--seed", min=0, help=SEED_HELP)),
    Flag("keep_workdirs", bool, lambda: typer.Option(
        False, "--keep-workdirs", help="Keep each trial's checkouts."), ("swe",)),
    Flag("keep_workdirs", bool, lambda: typer.Option(
        False, "--keep-workdirs", help="Keep each trial's /app."), ("terminal",)),
    Flag("flaky_reruns", int, lambda: typer.Option(
        0, "--flaky-reruns",
        help="Reruns of a failing test run; a test that passes in one counts as passed and is named flaky. Off by "
        "default, as in the SWE-bench harness: an agent's code can pass on a rerun on purpose."), ("swe",)),
    Flag("agent_profile", str, lambda: typer.Option(
        None, "--agent-profile", metavar="<full|compact>",
        help="glm5 agent: full (default) or compact (read, edit, bash, glob and a short prompt: for small models).")),
    Flag("predictions", Path, lambda: typer.Option(
        None, "--predictions", help="Also write the SWE-bench harness's predictions JSONL here (each task's first "
        "attempt), for `swebench eval -p`."), ("swe",)),
)  # fmt: skip
PATHS = {"swe": "tasks", "terminal": "task_dirs"}  # the positional argument of each kind


def command(kind: str) -> Callable[..., None]:
    """The Typer command of `kind`: a function whose signature is OPTIONS' rows for that kind."""
    rows = [f for f in OPTIONS if kind in f.kinds]

    def bench_run(**flags: Any) -> None:
        paths = list(flags.pop(PATHS[kind]) or [])
        run(kind, RunFlags(paths=paths, **{**FIXED.get(kind, {}), **flags}))

    kw = inspect.Parameter.POSITIONAL_OR_KEYWORD
    bench_run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(f.name, kw, default=f.declare(), annotation=f.type) for f in rows], return_annotation=None
    )
    bench_run.__annotations__ = {**{f.name: f.type for f in rows}, "return": None}
    bench_run.__doc__, bench_run.__name__ = DOCS[kind], kind
    return bench_run


def run(kind: str, f: RunFlags) -> None:
    """Load the tasks, make the agent, run (or resume) the job, show the report, gate on --min-resolved."""
    # agent/bench is imported here, not at the top: `glm5 --help` must not pay for it
    from agent.bench.agents import AgentLimits, make_agent
    from agent.bench.env_kinds import environment_kinds
    from agent.bench.job import load_tasks, run_job
    from agent.bench.run_folder import RunFolderError
    from agent.bench.runner import RunOptions, parse_shard
    from agent.bench.tasks import TaskError
    from agent.settings import SettingsError

    out = f.out.resolve()  # every trial and the repository cache live under it, whatever folder git runs in
    if f.k < 1 or f.n < 1 or f.retries < 0:
        fail("-k and -n must be >= 1 and --retries >= 0", code=EXIT_USAGE)
    if f.env not in ("local", "docker") and f.env not in environment_kinds():
        fail(f"--env {f.env!r}: expected local, docker or a plugin's environment", code=EXIT_USAGE)
    try:
        tasks, source, base_dir = load_tasks(kind, f.paths, f.suite, out / "suite")
        if f.env == "local":
            check_local(tasks, parse_shard(f.shard), f.filter_)
        bench_agent = make_agent(f.agent, base_url=f.base_url, model=f.model, provider=f.provider,
                                 api_key_env=f.api_key_env, temperature=f.temperature, profile=f.agent_profile,
                                 seed=f.seed)  # fmt: skip
        options = RunOptions(k=f.k, concurrency=f.n, shard=parse_shard(f.shard), filter=f.filter_, env=f.env,
                             retries=f.retries, limits=AgentLimits(f.max_turns, f.timeout, f.max_cost, f.memory_mb),
                             test_timeout_s=f.test_timeout, keep_workdirs=f.keep_workdirs, repos_dir=f.repos,
                             base_dir=base_dir, force=f.force, flaky_reruns=f.flaky_reruns, source=source,
                             retry_infra_errors=f.retry_infra_errors)  # fmt: skip
        with BenchProgress(kind) as progress:
            report = run_job(kind, tasks, bench_agent, out, options, f.junit, progress.event)
        if f.predictions is not None:
            write_predictions(out, f.predictions)
    except (TaskError, ValueError, RunFolderError, SettingsError, FileExistsError) as e:
        fail(str(e), code=EXIT_USAGE)
    except KeyboardInterrupt:
        fail(f"interrupted; rerun the same command to resume (finished trials are kept in {out})", code=130)
    show(report, f.as_json, out)
    infra = report["summary"]["infra_errors"]
    if infra and not f.as_json:
        err_console.print(f"{infra} trial(s) ended in an infrastructure error and are not scored; once the cause is "
                          "fixed, rerun the same command with --retry-infra-errors to run them again", style="yellow")  # fmt: skip
    gate(report, f.min_resolved)


def gate(report: dict, min_resolved: float | None) -> None:
    """--min-resolved: exit 1, saying why, when the run's resolved rate is below it."""
    from agent.bench.job import below  # lazily, as above: --help's speed

    if below(report, min_resolved):
        rate = report["summary"]["resolved_rate"]
        fail(f"resolved rate {'n/a' if rate is None else f'{rate:.3f}'} is below --min-resolved {min_resolved}",
             code=EXIT_BELOW)  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def show(report: dict, as_json: bool, out: Path | None) -> None:
    """The report's summary: JSON on stdout, or a table and the tasks not resolved."""
    if as_json:
        print_json({"summary": report["summary"], "report": str(out / "report.json") if out else None,
                    "complete": report["complete"], "runs": report["runs"]})  # fmt: skip
        return
    from rich.table import Table  # lazily, as above: --help's speed

    s, k = report["summary"], report["k"]
    t = Table(title=f"glm5 bench {report['kind']}: {(report.get('agent') or {}).get('agent')}", show_header=False)
    ci = s["resolved_rate_ci95"]
    t.add_row("resolved", f"{s['resolved']}/{s['graded']} ({_pct(s['resolved_rate'])}"
              + (f", 95% CI {_pct(ci[0])}-{_pct(ci[1])})" if ci else ")"))  # fmt: skip
    t.add_row("pass@1", _pct(s["pass@1"]))
    if k > 1:
        t.add_row(f"pass@{k}", _pct(s.get(f"pass@{k}")))
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
