"""Where a trial runs: a small protocol (start, exec, copy_in, copy_out, stop) and the registry of kinds.

Inside every environment the paths are Harbor's: /app the work (a git worktree for SWE tasks), /logs/agent and
/logs/verifier mounted from the trial folder, /tests copied in only for the verifier after the agent is done,
/solution only for the oracle. The kinds by name (`local`, `docker`, plugins' own) are in env_kinds.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

APP, LOGS, AGENT_LOGS, VERIFIER_LOGS, TESTS, SOLUTION = (
    "/app",
    "/logs",
    "/logs/agent",
    "/logs/verifier",
    "/tests",
    "/solution",
)


class InfraError(RuntimeError):
    """The environment did not build, the sandbox died, the endpoint stayed down: kept out of the score."""


@dataclass
class ExecResult:
    returncode: int | None  # None: killed at the timeout
    output: str  # stdout and stderr interleaved
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass
class EnvSpec:
    """What a trial asks of its environment."""

    trial_dir: Path  # RUN/trials/<id>/<attempt>; the environment keeps its state under it
    app_source: Callable[[Path], None] | None = None  # fills the host folder behind /app (worktree, copy)
    setup: str | None = None  # a command run once in /app before the agent (cached by the environment)
    setup_key: str | None = None  # cache key for `setup` (repo + version)
    python: str | None = None  # local: the Python version the task's environment is built with ("3.9")
    cache_dir: Path | None = None  # where cached setups live (shared between trials)
    image: str | None = None  # docker: the image, or
    dockerfile_dir: Path | None = None  # docker: a build context with a Dockerfile
    memory_mb: int | None = None
    cpus: int | None = None
    network: bool = False
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = APP  # a task's working folder other than /app (task.toml [environment] workdir) is /app too
    # SWE tasks: /app/.git read-only inside (the answer is the working tree's diff); terminal tasks may need git
    protect_git: bool = True
    # host files and folders hidden inside (the task files with their gold patches, the run folder with other
    # trials and the repository cache's later history); the trial's own folders stay, bound over them
    hidden: tuple[Path, ...] = ()


@runtime_checkable
class Environment(Protocol):
    name: str
    app_dir: Path  # the host folder that is /app inside (the agent's file tools work on it)

    def start(self) -> None: ...

    def exec(
        self,
        command: str,
        *,
        cwd: str = APP,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> ExecResult: ...

    def copy_in(self, src: Path, dest: str) -> None: ...

    def copy_out(self, src: str, dest: Path) -> None: ...

    def stop(self) -> None: ...

    def wrap(self, argv: list[str], cwd: str = APP) -> list[str]:
        """argv that runs `argv` inside the environment (how the glm5 agent's bash tool gets in)."""
        ...
