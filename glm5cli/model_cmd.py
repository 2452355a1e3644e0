"""`glm5 model`: checkpoints."""

from __future__ import annotations

import typer

from glm5cli.common import not_built

app = typer.Typer(no_args_is_help=True)


@app.command("init")
def init() -> None:
    """Write a random-initialised checkpoint from a preset."""
    not_built("model init")


@app.command("info")
def info() -> None:
    """Show a checkpoint's layers, parameters and memory."""
    not_built("model info")
