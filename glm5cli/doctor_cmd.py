"""`glm5 doctor`: which of the agent's protections work on this machine (sandbox, network, git, environment)."""

from __future__ import annotations

from pathlib import Path

import typer

from glm5cli.common import console, print_json


def show_checks(cwd: Path, as_json: bool) -> int:
    """Run the checks, print them, and return the exit code: 0 when every protection is active, 1 otherwise."""
    from agent.checkpoints import git_root
    from agent.doctor import as_json as checks_json
    from agent.doctor import run_checks

    repo = git_root(cwd.resolve()) or cwd.resolve()
    checks = run_checks(repo)
    if as_json:
        print_json({"ok": all(c.ok for c in checks), "checks": checks_json(checks)})
    else:
        marks = {True: "[green]ok[/]", False: "[bold red]NO[/]", None: "[yellow]unknown[/]"}
        for c in checks:
            console.print(f"{marks[c.ok]:>22}  {c.name}: {c.detail}", highlight=False)
        if not all(c.ok for c in checks):
            console.print(
                "[bold red]Some protections are not active:[/] model-written commands can do more than the "
                "sandbox promises here. Install bubblewrap (apt-get install bubblewrap) or run where user "
                "namespaces are allowed.",
                highlight=False,
            )
    return 0 if all(c.ok for c in checks) else 1


def doctor(
    json_out: bool = typer.Option(False, "--json", help="Print the checks as JSON for scripts."),
    cwd: Path = typer.Option(Path("."), "--cwd", help="The repository whose trust status to report."),
) -> None:
    """Try each protection for real: bubblewrap, read-only filesystem, network off, .git and .glm5 read-only,
    no capabilities, the host's git running no repository-configured programs, the scrubbed environment.
    Exit 0 when all are active, 1 when one is not."""
    raise typer.Exit(show_checks(cwd, json_out))
