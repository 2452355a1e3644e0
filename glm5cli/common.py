"""Helpers shared by the command modules: consoles, user-facing errors, JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

from agent.ui import terminal_safe


class SafeConsole(Console):
    """A rich Console that draws every string it is given with its control characters escaped: task files, model
    text and file names reach these prints, and rich itself passes an escape sequence through to the terminal."""

    def render_str(self, text: str, **kw: Any):
        return super().render_str(terminal_safe(text), **kw)

    def print(self, *objects: Any, **kw: Any) -> None:
        """Off a terminal (a log file, a pipe, CI) a line is written whole: rich would wrap it at 80 columns, in
        the middle of a progress line or a path. Tables still fit the width."""
        if "soft_wrap" not in kw and not self.is_terminal:
            kw["soft_wrap"] = True
        super().print(*objects, **kw)


console = SafeConsole()
err_console = SafeConsole(stderr=True)

# Exit codes used across commands (scripts rely on them).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def fail(message: str, code: int = EXIT_ERROR, hint: str | None = None) -> NoReturn:
    """Print `message` (and what to do about it) on stderr and exit with `code`. Both are plain text: a `[table]`
    in them is printed, not taken for rich markup."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if hint:
        err_console.print(f"[dim]hint:[/] {escape(hint)}", highlight=False)
    raise typer.Exit(code)


def not_built(command: str) -> NoReturn:
    """A command that exists in the product's plan but not in this build: say so and exit 2."""
    fail(f"`glm5 {command}` is not built yet in this version of glm5.", code=EXIT_USAGE)


def print_json(obj: Any) -> None:
    """Write `obj` as JSON on stdout, unstyled, for scripts."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
