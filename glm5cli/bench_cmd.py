"""`glm5 bench`: agentic and serving benchmarks."""

from __future__ import annotations

import typer

from glm5cli.common import not_built

app = typer.Typer(no_args_is_help=True)


@app.command("swe")
def swe() -> None:
    """Run SWE-bench-format tasks with the agent."""
    not_built("bench swe")


@app.command("serve")
def serve() -> None:
    """Load-test an OpenAI-compatible server (sglang bench_serving semantics)."""
    not_built("bench serve")
