"""Built-in RL rewards, registered through the `register_rewards` hook exactly as a third-party plugin would.

A reward is registered as `register(name, make)`. `make(spec)` checks a task's reward spec (the "reward"
object of a line of `glm5 finetune rl --tasks`, {"type": name, ...}) and raises ValueError for a bad one, so
that bad tasks are reported before any training; it returns `score(completion: str) -> float | None`. None
means the environment failed rather than the model (a checker that could not run): the sample is left out of
its group instead of being scored 0 (GLM-5's environment-failure filtering).

    regex    {"type": "regex", "pattern": "...", "ignore_case": false}: 1.0 if the pattern occurs, else 0.0
    command  {"type": "command", "run": "python check.py", "timeout": 60, "score": false, "memory_mb": 4096}:
             runs `run` with a shell in a fresh temporary directory that holds the completion as completion.txt
             (its path also in $GLM5_COMPLETION, its text on stdin). The completion is model output, so the
             command runs in the agent's bubblewrap sandbox (agent/sandbox.py): network off, nothing writable but
             that directory (`cwd`, when given, is read-only), a scrubbed environment (agent/child_env.py), CPU
             time, memory and file-size limits. Where bubblewrap cannot run the spec is refused unless it says
             "sandbox": false. Exit 0 scores 1.0, any other exit 0.0; with "score": true
             the last line of stdout is the reward (a number). A timeout scores 0.0 (the completion made the
             check hang); a shell that cannot find the command (exit 126/127) or an unreadable score is an
             environment failure (None).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent.child_env import scrubbed_env
from agent.plugin_registry import hookimpl
from agent.sandbox import Sandbox, SandboxLimits, limit_argv

Score = Callable[[str], "float | None"]


def _regex(spec: dict) -> Score:
    pattern = spec.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError('a "regex" reward needs "pattern": a non-empty string')
    try:
        rx = re.compile(pattern, re.IGNORECASE if spec.get("ignore_case") else 0)
    except re.error as e:
        raise ValueError(f"bad regex {pattern!r}: {e}") from None
    return lambda completion: 1.0 if rx.search(completion) else 0.0


def _command(spec: dict) -> Score:
    run = spec.get("run")
    if not isinstance(run, str) or not run.strip():
        raise ValueError('a "command" reward needs "run": the shell command that checks a completion')
    timeout = spec.get("timeout", 60)
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError('"timeout" must be a positive number of seconds')
    cwd = spec.get("cwd")
    if cwd is not None and not Path(cwd).is_dir():
        raise ValueError(f'"cwd" {cwd!r} is not a directory')
    memory_mb = spec.get("memory_mb", 4096)
    if not isinstance(memory_mb, int) or memory_mb <= 0:
        raise ValueError('"memory_mb" must be a positive whole number of megabytes')
    use_score = bool(spec.get("score", False))
    sandbox = _sandbox(spec)
    limits = SandboxLimits(memory_mb=memory_mb, cpu_s=int(timeout) + 1, file_mb=1024)

    def score(completion: str) -> float | None:
        with tempfile.TemporaryDirectory(prefix="glm5-reward-") as tmp:
            path = Path(tmp) / "completion.txt"
            path.write_text(completion, encoding="utf-8")
            # the model's output is hostile: no keys in the environment, no network, nothing writable but tmp
            env = scrubbed_env({"GLM5_COMPLETION": str(path)})
            argv = ["bash", "-c", run]
            workdir = Path(cwd).resolve() if cwd else Path(tmp)
            if sandbox is not None:
                ro = [(workdir, workdir)] if cwd else []
                argv = sandbox.wrap(argv, Path(tmp), workdir, Path(tmp), ro_binds=ro, limits=limits)
            else:
                argv = limit_argv(argv, limits)
            try:
                p = _run(argv, workdir, completion, env, timeout)
            except subprocess.TimeoutExpired:
                return 0.0
        if p.returncode in (126, 127):  # the shell could not run the command: not the completion's fault
            score.last_error = f"`{run}` exited {p.returncode}: {p.stderr.strip()[-500:]}"  # shown if all fail
            return None
        if not use_score:
            return 1.0 if p.returncode == 0 else 0.0
        lines = p.stdout.strip().splitlines()
        try:
            return float(lines[-1]) if lines else None
        except ValueError:
            return None

    return score


def _sandbox(spec: dict):
    """The agent's bubblewrap sandbox (network off); None only when the spec says "sandbox": false."""
    if spec.get("sandbox", True) is False:
        return None
    sb = Sandbox(True, network=False)
    if not sb.active:
        raise ValueError(
            f'the "command" reward runs model output, so it needs the sandbox, which cannot run here: {sb.reason}. '
            'Install bubblewrap, or set "sandbox": false in the reward spec to run it unsandboxed.'
        )
    return sb


def _run(argv: list[str], cwd: Path, stdin: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run in a new session; at the timeout the whole process group goes (the sandbox's pid namespace with it)."""
    proc = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@hookimpl
def register_rewards(register, context) -> None:
    register("regex", _regex)
    register("command", _command)
