"""What `glm5 bench` says about a run against the official SWE-bench harness and the local environment: before a
local run, what of each task it cannot honour and which Python versions the machine lacks; `bench compare RUN
REPORT.json`, the harness's report beside the run. The work is in agent/bench (local_gaps, setup_cache,
harness_io); this shows it, importing it inside each function so that `glm5 --help` does not pay for it.
"""

from __future__ import annotations

from pathlib import Path

from glm5cli.common import EXIT_USAGE, console, err_console, fail, print_json


def check_local(tasks: list, shard: tuple[int, int], filter_: str | None) -> None:
    """Before a local run, on the tasks it will run: what local mode cannot honour (said), and a Python version the
    machine lacks (a usage error, before any trial)."""
    from agent.bench.runner import select
    from agent.bench.setup_cache import missing_pythons

    chosen = select(tasks, shard, filter_)
    say_local_gaps(chosen)
    for version, ids in missing_pythons([t for t in chosen if getattr(t, "kind", "") == "swe"]).items():
        fail(f"{len(ids)} task(s) need Python {version} ({', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}),"
             f" which this machine does not have: use --env docker, or install it (pyenv install {version},"
             f" uv python install {version})", code=EXIT_USAGE)  # fmt: skip


def write_predictions(run: Path, dest: Path) -> None:
    """`--predictions`: the run's patches in the harness's predictions JSONL."""
    from agent.bench.harness_io import write_predictions as write

    err_console.print(f"{write([run], dest)} prediction(s) in the SWE-bench harness's format: {dest}")


def say_local_gaps(tasks: list) -> None:
    """Before a local run: what of each task local mode cannot honour (a Dockerfile's RUN, ENV, base image...)."""
    from agent.bench.local_gaps import local_gaps

    gaps = [(t.task_id, g) for t in tasks if (g := local_gaps(t))]
    if not gaps:
        return
    err_console.print(f"--env local cannot honour parts of {len(gaps)} task(s); --env docker does:", style="yellow")
    for tid, g in gaps[:10]:
        err_console.print(f"  {tid}: {'; '.join(g)}", highlight=False, style="yellow")
    if len(gaps) > 10:
        err_console.print(f"  ... and {len(gaps) - 10} more", style="yellow")


def compare_with_harness(run: Path, harness_report: Path, as_json: bool) -> None:
    """`glm5 bench compare RUN REPORT.json`: the harness's report beside a glm5 run, instance by instance."""
    from agent.bench.harness_io import compare_with_harness as compare
    from agent.bench.run_folder import RunFolderError

    try:
        c = compare([run], harness_report)
    except (RunFolderError, OSError, ValueError) as e:
        fail(str(e), code=EXIT_USAGE)
    if as_json:
        print_json(c)
        return
    console.print(f"glm5 {run} against the harness's {harness_report.name}: {c['agree']} of {c['compared']} "
                  "instances graded alike")  # fmt: skip
    for r in c["disagree"]:
        console.print(f"  differ: {r['instance_id']}: glm5 {r['glm5']}, harness {r['harness']}", highlight=False)
    for name, ids in (("only in glm5's run", c["only_glm5"]), ("only in the harness's report", c["only_harness"])):
        if ids:
            console.print(f"{name}: {', '.join(ids)}", highlight=False)
