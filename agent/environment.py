"""The environment: where the agent's actions happen. A local git repository, commands as subprocesses.

As in mini-swe-agent, every command is its own `bash -c` process in a new session (no shell state carries over,
so an interrupted or broken command cannot corrupt the next one); at the timeout the whole process group is
killed and the partial output kept. Commands run inside the bubblewrap sandbox when it is available.
Background jobs write to a log file the model can read later. Output longer than `inline_chars` is saved to a
file and shown as head and tail.

Knows nothing of models or permissions; the `bash` tool and the `!cmd` of the TUI both come through here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent import host_path, spawn
from agent.child_env import scrubbed_env
from agent.redact import Redactor
from agent.sandbox import Sandbox, SandboxLimits, limit_argv
from agent.terminal import Terminals


@dataclass
class CommandResult:
    output: str  # stdout and stderr interleaved, possibly cut to head + tail
    returncode: int | None  # None when killed at the timeout
    timed_out: bool = False
    full_output_path: str | None = None  # where the whole output went when it was cut
    duration_s: float = 0.0


@dataclass
class BackgroundJob:
    id: int
    command: str
    proc: subprocess.Popen
    log_path: Path
    started: float = field(default_factory=time.time)
    pump: threading.Thread | None = None  # copies the job's output, redacted, into log_path

    def status(self) -> str:
        rc = self.proc.poll()
        if rc is not None and self.pump is not None:
            self.pump.join(timeout=2)  # an exited job's log is complete once its status says so
        return "running" if rc is None else f"exited {rc}"

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the job to exit and its last output to reach the log."""
        rc = self.proc.wait(timeout)
        if self.pump is not None:
            self.pump.join(timeout)
        return rc


def shown_path(path: Path, root: Path, shown_root: Path | None) -> Path:
    """`path` as the model is shown it: under `shown_root` in place of `root` (a bench trial's /app), else as is."""
    if shown_root is None or not Path(path).is_relative_to(root):
        return Path(path)
    return shown_root / Path(path).relative_to(root)


class Environment:
    """A repository on the local machine. `root` is the repository, `cwd` where commands start."""

    def __init__(
        self,
        root: Path,
        cwd: Path | None = None,
        sandbox: Sandbox | None = None,
        scratch_dir: Path | None = None,
        extra_dirs: tuple[str, ...] = (),
        inline_chars: int = 30000,
        default_timeout_s: float = 120.0,
        max_timeout_s: float = 600.0,
        env: dict[str, str] | None = None,
        limits: SandboxLimits | None = None,
        shown_root: str | None = None,
        shown_date: str | None = None,
    ):
        self.root = Path(root).resolve()
        # The path the model is shown for the repository: a bench trial's /app, where its commands run. The system
        # prompt names it, and the file tools take paths under it as paths under `root`, so the model sees one
        # folder, the same in every trial (no host path in its prompt, none in the sessions trained on).
        self.shown_root = Path(shown_root) if shown_root else None
        # The date the system prompt gives (None: today). A bench trial's is its task's, so that a seeded rerun on
        # another day sends the same prompt.
        self.shown_date = shown_date
        self.cwd = Path(cwd).resolve() if cwd else self.root
        self.sandbox = sandbox
        self.scratch_dir = Path(scratch_dir) if scratch_dir else Path(tempfile.mkdtemp(prefix="glm5-"))
        self.extra_dirs = tuple(Path(d).expanduser().resolve() for d in extra_dirs)
        # what commands may write: the programs glm5 runs on the host (git, bwrap, rg) never come from there, for
        # as long as this environment lives (close() ends it; a command run after that guards them again)
        self._guard: host_path.Guard | None = None
        self._guard_folders()
        self.inline_chars = inline_chars
        self.default_timeout_s = default_timeout_s
        self.max_timeout_s = max_timeout_s
        # Commands never inherit the agent's environment (API keys): an allowlist, plus what settings add.
        self.env = scrubbed_env() if env is None else env
        self.limits = limits
        self.redactor = Redactor()
        self.interrupt: threading.Event | None = None  # set by the interface (Esc): the running command is killed
        self.jobs: dict[int, BackgroundJob] = {}
        self._n_outputs = 0
        self._terminals = None  # agent/terminal.py's sessions, made at the first terminal_open

    @property
    def terminals(self):
        """The interactive terminal sessions (agent/terminal.py), started in the sandbox as commands are."""
        if self._terminals is None:
            self.scratch_dir.mkdir(parents=True, exist_ok=True)
            sandboxed = self.sandbox is not None and self.sandbox.active
            self._terminals = Terminals(lambda argv: self.wrap_argv(argv, tty=True), str(self.cwd), self.env,
                                        sandboxed)  # fmt: skip
        return self._terminals

    # -- paths -------------------------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        if not p.is_absolute():
            p = self.cwd / p
        p = Path(os.path.normpath(p))
        shown = self.shown_root
        if shown is not None and (p == shown or shown in p.parents) and not (p == self.root or self.root in p.parents):
            p = self.root / p.relative_to(shown)  # normalised first: /app/../etc is /etc, never mapped
        return p

    def shown(self, path: Path) -> Path:
        """`path` (under root) as the model is shown it."""
        return shown_path(path, self.root, self.shown_root)

    def is_allowed(self, path: Path) -> bool:
        """Inside the repository, an allowed extra directory, or this session's scratch folder."""
        p = Path(os.path.realpath(path))
        for base in (self.root, Path(os.path.realpath(self.scratch_dir)), *self.extra_dirs):
            if p == base or base in p.parents:
                return True
        return False

    def display(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    # -- commands ----------------------------------------------------------------------------------------------

    def _argv(self, command: str) -> list[str]:
        return self.wrap_argv(["bash", "-c", command])

    def wrap_argv(self, argv: list[str], tty: bool = False) -> list[str]:
        """`argv` as every command runs: in the sandbox when it is active, under the limits. Whatever runs it, the
        folders it may write are guarded from host-program lookups from here on (again, after a close)."""
        self._guard_folders()
        if self.sandbox is not None and self.sandbox.active:
            kw = {"tty": True} if tty else {}  # a terminal session's program: the sandbox keeps it on a terminal
            return self.sandbox.wrap(argv, root=self.root, cwd=self.cwd, scratch=self.scratch_dir, limits=self.limits,
                                     **kw)  # fmt: skip
        return limit_argv(argv, self.limits)

    def execute(self, command: str, timeout_s: float | None = None) -> CommandResult:
        timeout = min(float(timeout_s or self.default_timeout_s), self.max_timeout_s)
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with tempfile.TemporaryFile(dir=self.scratch_dir) as out:
            # A file, not a pipe: a command that leaves a child behind (`server &`) must not keep us waiting.
            proc = self._spawn(command, out)
            timed_out = interrupted = False
            rc: int | None = None
            deadline = time.monotonic() + timeout
            try:
                while True:
                    try:
                        rc = proc.wait(timeout=0.05)
                        break
                    except subprocess.TimeoutExpired:
                        if self.interrupt is not None and self.interrupt.is_set():
                            interrupted = True
                        elif time.monotonic() >= deadline:
                            timed_out = True
                        else:
                            continue
                        _kill_group(proc)
                        break
            except KeyboardInterrupt:
                _kill_group(proc)
                raise
            out.seek(0)
            text = out.read().decode("utf-8", errors="replace")
        res = CommandResult(output=text, returncode=rc, timed_out=timed_out, duration_s=time.monotonic() - t0)
        if timed_out:
            res.output += f"\n[command killed after {timeout:g}s timeout]"
        if interrupted:
            res.output += "\n[command killed: the user interrupted]"
        return self.cut(res)

    def cut(self, res: CommandResult) -> CommandResult:
        """Long output: keep the whole of it in a file and show head and tail."""
        if len(res.output) <= self.inline_chars:
            return res
        self._n_outputs += 1
        path = self.scratch_dir / f"output-{self._n_outputs}.txt"
        # redacted like the trajectory: nothing glm5 writes to disk holds a key the output happened to print
        with _create(path) as f:
            f.write(self.redactor.text(res.output).encode("utf-8"))
        half = self.inline_chars // 2
        elided = len(res.output) - 2 * half
        res.output = (
            f"{res.output[:half]}\n\n[... {elided} characters elided; the whole output is in {path} ...]\n\n"
            f"{res.output[-half:]}"
        )
        res.full_output_path = str(path)
        return res

    def _guard_folders(self) -> None:
        if self._guard is None:
            self._guard = host_path.guard(self.root, self.scratch_dir, *self.extra_dirs)

    def _spawn(self, command: str, out) -> subprocess.Popen:
        """The command in its own session (so a timeout kills its whole process group), output to `out`."""
        self._guard_folders()
        return spawn.popen(
            self._argv(command),
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.env,
        )

    def start_background(self, command: str) -> BackgroundJob:
        """The job's output comes to the host through a pipe and is written to its log redacted, line by line, so
        the log on disk never holds a key the job printed (the command cannot write the log itself)."""
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        job_id = len(self.jobs) + 1
        log = self.scratch_dir / f"job-{job_id}.log"
        f = _create(log)
        proc = self._spawn(command, subprocess.PIPE)
        job = BackgroundJob(job_id, command, proc, log)
        job.pump = threading.Thread(target=self._pump, args=(proc.stdout, f), daemon=True, name=f"glm5-job-{job_id}")
        job.pump.start()
        self.jobs[job_id] = job
        return job

    def _pump(self, stream, log) -> None:
        with stream, log:
            for line in iter(stream.readline, b""):
                log.write(self.redactor.text(line.decode("utf-8", errors="replace")).encode("utf-8"))
                log.flush()

    def close(self) -> None:
        """Kill background jobs and terminal sessions still running (job logs are complete when this returns), and
        end this environment's guard of its folders."""
        if self._terminals is not None:
            self._terminals.close_all()
        for job in self.jobs.values():
            if job.proc.poll() is None:
                _kill_group(job.proc)
            if job.pump is not None:
                job.pump.join(timeout=5)
        if self._guard is not None:
            self._guard.release()
            self._guard = None


def _create(path: Path):
    """A new file the host writes in the scratch folder, which commands can write too: whatever a command left
    at that name (a link to ~/.bashrc, say) is removed, never followed."""
    if path.is_symlink() or path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    return os.fdopen(fd, "wb")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
