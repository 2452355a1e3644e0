"""Built-in RL rewards, registered through the `register_rewards` hook exactly as a third-party plugin would.

A reward is registered as `register(name, make)`. `make(spec)` checks a task's reward spec (the "reward"
object of a line of `glm5 finetune rl --tasks`, {"type": name, ...}) and raises ValueError for a bad one, so
that bad tasks are reported before any training; it returns `score(completion: str) -> float | None`. None
means the environment failed rather than the model (a checker that could not run): the sample is left out of
its group instead of being scored 0 (GLM-5's environment-failure filtering).

    regex    {"type": "regex", "pattern": "...", "ignore_case": false}: 1.0 if the pattern occurs, else 0.0
    command  {"type": "command", "run": "python check.py", "timeout": 60, "score": false}: runs `run` with a
             shell in a fresh temporary directory that holds the completion as completion.txt (its path also
             in $GLM5_COMPLETION, its text on stdin). Exit 0 scores 1.0, any other exit 0.0; with "score": true
             the last line of stdout is the reward (a number). A timeout scores 0.0 (the completion made the
             check hang); a shell that cannot find the command (exit 126/127) or an unreadable score is an
             environment failure (None).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

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
    use_score = bool(spec.get("score", False))

    def score(completion: str) -> float | None:
        with tempfile.TemporaryDirectory(prefix="glm5-reward-") as tmp:
            path = Path(tmp) / "completion.txt"
            path.write_text(completion, encoding="utf-8")
            env = {**os.environ, "GLM5_COMPLETION": str(path)}
            try:
                p = subprocess.run(
                    run,
                    shell=True,
                    cwd=cwd or tmp,
                    input=completion,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    env=env,
                    start_new_session=True,  # the whole process group goes at a timeout
                )
            except subprocess.TimeoutExpired:
                return 0.0
        if p.returncode in (126, 127):  # the shell could not run the command: not the completion's fault
            return None
        if not use_score:
            return 1.0 if p.returncode == 0 else 0.0
        lines = p.stdout.strip().splitlines()
        try:
            return float(lines[-1]) if lines else None
        except ValueError:
            return None

    return score


def register_rewards(register, context) -> None:
    register("regex", _regex)
    register("command", _command)
