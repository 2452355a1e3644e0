"""`glm5 code`: the coding agent. The TUI by default; headless with `-p "task"` for scripts and CI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from glm5cli.common import err_console, fail

EPILOG = (
    "Headless exit codes: 0 done, 1 error (endpoint, crash), 2 bad input, 3 a limit was reached, 4 done but some "
    "tool calls were refused (listed in `denied`), 130 interrupted. --undo, --rewind N and --diff work on the latest "
    "session, or on the one named by ID, without calling the model."
)


def code(
    prompt: str = typer.Option(None, "--print", "-p", help="Run headless on this task ('-' reads it from stdin)."),
    output_format: str = typer.Option(
        "text",
        "--output-format",
        metavar="<text|json|stream-json>",
        help="Headless output: text, json or stream-json.",
    ),
    max_turns: int = typer.Option(None, "--max-turns", min=1, help="At most this many model calls for the task."),
    approval: str = typer.Option(
        "deny",
        "--approval",
        metavar="<auto|deny>",
        help="Headless answer to permission asks: auto or deny.",
    ),
    mode: str = typer.Option(
        None,
        "--mode",
        metavar="<ask|accept-edits|plan|auto>",
        help="Permission mode: ask, accept-edits, plan or auto.",
    ),
    profile: str = typer.Option(
        None,
        "--profile",
        metavar="<full|compact>",
        help="Agent profile: full (default) or compact (read, edit, bash, glob and a short prompt: for small models).",
    ),
    continue_: bool = typer.Option(False, "--continue", "-c", help="Continue the latest session here."),
    resume: bool = typer.Option(False, "--resume", "-r", help="Resume a session: `--resume [ID]` (latest without ID)."),
    session_id: str = typer.Argument(None, metavar="[ID]", help="The session to resume (with --resume)."),
    provider: str = typer.Option(None, "--provider", help="A named provider from the config file (local, zai, ...)."),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1."),
    model: str = typer.Option(None, "--model", help="Model name sent to the endpoint."),
    api_key_env: str = typer.Option(None, "--api-key-env", help="Name of the environment variable holding the key."),
    allow: list[str] = typer.Option(None, "--allow", help="Extra allow rule, e.g. 'bash(pytest)'. Repeatable."),
    deny: list[str] = typer.Option(None, "--deny", help="Extra deny rule, e.g. 'bash(git push)'. Repeatable."),
    max_cost: float = typer.Option(None, "--max-cost", help="Stop when the session has cost this many USD."),
    no_sandbox: bool = typer.Option(False, "--no-sandbox", help="Run commands without bubblewrap."),
    sessions_dir: str = typer.Option(None, "--sessions-dir", help="Where trajectories go (default .glm5/sessions)."),
    cwd: Path = typer.Option(Path("."), "--cwd", help="Working folder (inside the repository)."),
    trust: bool = typer.Option(
        False,
        "--trust",
        help="Trust this repository's own .glm5 settings for this run (otherwise they may only narrow permissions).",
    ),
    sandbox_check: bool = typer.Option(False, "--sandbox-check", help="Say which protections work here and exit."),
    undo: bool = typer.Option(
        False,
        "--undo",
        help="Undo the last turn of the latest (or given) session: code and conversation. No model is called.",
    ),  # fmt: skip
    rewind: int = typer.Option(
        None,
        "--rewind",
        min=0,
        metavar="N",
        help="Undo the last N turns of the latest (or given) session; 0 lists the turns.",
    ),  # fmt: skip
    diff: bool = typer.Option(False, "--diff", help="Print what the latest (or given) session changed so far."),
) -> None:
    """Run the coding agent in the current git repository (the help text and EPILOG are what --help shows)."""
    # the agent's modules are imported in the command and its helpers below, so that `glm5 --help` stays fast
    from agent.headless import EXIT_BAD_INPUT, FORMATS, HeadlessUI, is_session_command, run_headless

    if output_format not in FORMATS:
        fail(f"--output-format must be one of {', '.join(FORMATS)}", code=EXIT_BAD_INPUT)
    if approval not in ("auto", "deny"):
        fail("--approval must be auto or deny", code=EXIT_BAD_INPUT)
    if not cwd.is_dir():
        fail(f"--cwd {cwd} is not a folder", code=EXIT_BAD_INPUT)
    flags = {
        "provider": provider,
        "base_url": base_url,
        "model": model,
        "api_key_env": api_key_env,
        "mode": mode,
        "profile": profile,
        "max_turns": max_turns,
        "max_cost_usd": max_cost,
        "allow": tuple(allow or ()),
        "deny": tuple(deny or ()),
        "sessions_dir": sessions_dir,
        "sandbox": False if no_sandbox else None,
        "trust": trust or None,
    }
    if sandbox_check:
        from glm5cli.doctor_cmd import show_checks

        raise typer.Exit(show_checks(cwd, output_format == "json"))
    settings = _settings(cwd, flags)
    actions = [a for a, on in (("/undo", undo), (f"/rewind {rewind or ''}".strip(), rewind is not None),
                                ("/diff", diff)) if on]  # fmt: skip
    if not actions and prompt is not None and is_session_command(prompt):
        actions, prompt = [prompt.strip()], None  # `-p "/undo"`: the command, not a task for the model
    if actions:
        if len(actions) > 1 or prompt is not None:
            fail("--undo, --rewind and --diff go alone (not with each other or -p)", code=EXIT_BAD_INPUT)
        raise typer.Exit(_session_command(cwd, settings, session_id, actions[0], output_format))

    _check_endpoint(settings, base_url)
    if session_id is not None and not resume:
        fail(f"unexpected argument {session_id!r}: give a task with -p, or a session id after --resume",
             code=EXIT_BAD_INPUT)  # fmt: skip
    resume_id = session_id if resume else None
    wants_resume = resume

    if prompt is None and not sys.stdin.isatty():
        prompt = "-"  # `echo task | glm5 code` runs headless, like -p -
    if prompt is not None:
        if prompt == "-":
            prompt = sys.stdin.read()
        if not prompt.strip():
            fail("the task given with -p is empty", code=EXIT_BAD_INPUT)
        ui = HeadlessUI(output_format, approval)
        session = _build(cwd, settings, ui, resume=resume_id if wants_resume else None,
                         continue_latest=continue_ or (wants_resume and resume_id is None))  # fmt: skip
        raise typer.Exit(run_headless(session, prompt, ui))

    from agent.tui.app import run_tui

    raise typer.Exit(
        run_tui(cwd, settings, resume=resume_id, continue_latest=continue_ or (wants_resume and resume_id is None))
    )


def _settings(cwd: Path, flags: dict) -> Any:
    """The settings for the repository `cwd` is in; a wrong one exits 2 with its message."""
    from agent.checkpoints import git_root
    from agent.headless import EXIT_BAD_INPUT
    from agent.settings import SettingsError, load_settings

    try:
        return load_settings(git_root(cwd.resolve()) or cwd.resolve(), flags)
    except (SettingsError, ValueError) as e:
        fail(str(e), code=EXIT_BAD_INPUT)


def _build(cwd: Path, settings: Any, ui: Any, **kwargs: Any) -> Any:
    """build_session; a session that cannot be found or opened exits 2 with why."""
    from agent.builder import build_session
    from agent.headless import EXIT_BAD_INPUT

    try:
        return build_session(cwd, settings, ui, **kwargs)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e), code=EXIT_BAD_INPUT)


def _session_command(cwd: Path, settings: Any, session_id: str | None, action: str, output_format: str) -> int:
    """--undo / --rewind N / --diff on the latest (or named) session, without the model: the exit code."""
    from agent.headless import HeadlessUI, NoModel, run_session_command

    session = _build(cwd, settings, HeadlessUI(output_format), resume=session_id,
                     continue_latest=session_id is None, model=NoModel())  # fmt: skip
    return run_session_command(session, action, output_format)


def _check_endpoint(settings: Any, base_url: str | None) -> None:
    """Exit 1 when a local endpoint refuses the connection; warn when a hosted one's key variable is unset."""
    from agent.endpoint import check, origin

    p = settings.provider
    unreachable = check(p.base_url, origin(settings, base_url))
    if unreachable:  # exit 1 (EXIT_ERROR), as for any endpoint error
        message, _, hint = unreachable.partition("\n")
        fail(message, code=1, hint=hint)
    if p.api_key_env and not p.api_key and not p.base_url.startswith(("http://127.", "http://localhost")):
        # a warning, not an error: a self-hosted endpoint may need no key; a hosted one will answer 401 (exit 1)
        err_console.print(f"[yellow]warning:[/] ${p.api_key_env} is not set (provider {p.name!r} at {p.base_url})")
