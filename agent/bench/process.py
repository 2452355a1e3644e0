"""A command run to its end in its own session, its output kept from a file: the start and the end of it.

`run_argv` is how every environment runs what a trial asks (local: bubblewrap's argv; docker: `docker exec`) and
how a task's setup runs: a child left behind cannot hold a pipe open, at the timeout the whole process group is
killed, and a command printing 100 MB costs neither 100 MB of memory nor of every log it reaches.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from agent.bench.environments import ExecResult, InfraError

OUTPUT_HEAD, OUTPUT_TAIL = 256 * 1024, 4 * 2**20  # what a command's output keeps: its start and (for a test log's
# summary) its end; a command printing 100 MB no longer costs 100 MB of memory and of every log it reaches


def _head_and_tail(f) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    if size <= OUTPUT_HEAD + OUTPUT_TAIL:
        return f.read().decode("utf-8", errors="replace")
    head = f.read(OUTPUT_HEAD).decode("utf-8", errors="replace")
    f.seek(size - OUTPUT_TAIL)
    tail = f.read().decode("utf-8", errors="replace")
    return f"{head}\n[... {size - OUTPUT_HEAD - OUTPUT_TAIL:,} bytes of output left out ...]\n{tail}"


def run_argv(argv: list[str], env: dict[str, str], timeout_s: float | None, stdin: str | None,
             scratch: Path) -> ExecResult:  # fmt: skip
    """Run argv in its own session, output to a file (a child left behind cannot hold a pipe open); at the
    timeout the whole process group is killed and the output so far kept."""
    scratch.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryFile(dir=scratch) as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        except OSError as e:
            raise InfraError(f"could not start {argv[0]}: {e}") from None
        if stdin is not None:
            try:
                proc.stdin.write(stdin.encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
        timed_out = False
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        text = _head_and_tail(out)
    if timed_out:
        text += f"\n[killed after the {timeout_s:g}s timeout]"
    return ExecResult(rc, text, timed_out, time.monotonic() - t0)
