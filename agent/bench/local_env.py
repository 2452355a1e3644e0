"""The `local` environment: a folder of the trial behind /app, every command in the bubblewrap sandbox.

Layout under the environment's state folder (EnvSpec.trial_dir):
    app/            /app (a fresh clone for SWE tasks, a copy of environment/ for terminal tasks), writable
    logs/agent      /logs/agent, writable        logs/verifier   /logs/verifier, writable
    tests/          /tests, read-only, present only once the verifier's files are copied in
    solution/       /solution, read-only, present only for the oracle
    tmp/            the sandbox's scratch folder
Commands run as `glm5 code` runs them (agent/sandbox.py): the rest of the filesystem read-only, a private /tmp,
network off, no capabilities, rlimits from the task; the child environment is agent/child_env.py's allowlist.
A task's setup runs once per repo and version into a cached virtual environment of the task's own Python
(agent/bench/setup_cache.py), mounted read-only and first on PATH; without one, the Python that runs glm5 is first
on PATH. HOME is a writable folder of the trial. What local mode cannot honour: a task's Dockerfile (RUN, COPY,
ENV, WORKDIR: only the pip installs of a SWE-bench row's environment are taken, harness_specs.local_setup), system
packages, conda packages without a pip equivalent, and a different OS; `--env docker` honours them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from agent.bench.environments import APP, LOGS, SOLUTION, TESTS, EnvSpec, ExecResult, InfraError
from agent.bench.process import run_argv
from agent.bench.setup_cache import ensure_setup
from agent.child_env import scrubbed_env
from agent.host_files import write_beneath
from agent.sandbox import Sandbox, SandboxLimits

MOUNTS = (APP, LOGS, TESTS, SOLUTION)


def mountable_root(argv: list[str]) -> list[str]:
    """Replace the sandbox's read-only bind of `/` by binds of each top-level entry over bwrap's own root.

    bwrap cannot create a mount point such as /app inside a read-only bind of the host's `/`; over its tmpfs
    root it can. What is visible is the same: every host folder, read-only, except what later binds make writable.
    """
    if argv[1:4] != ["--ro-bind", "/", "/"]:
        return argv
    entries: list[str] = []
    for e in sorted(os.listdir("/")):
        p = "/" + e
        if e in ("proc", "dev", "tmp") or p in MOUNTS:
            continue
        if os.path.islink(p):
            entries += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            entries += ["--ro-bind", p, p]
    return [argv[0], *entries, *argv[4:]]


class LocalEnvironment:
    name = "local"

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self.state = Path(spec.trial_dir).resolve()
        self.app_dir = self.state / "app"
        self.logs = self.state / "logs"
        self.hosts = {
            APP: self.app_dir,
            LOGS: self.logs,
            TESTS: self.state / "tests",
            SOLUTION: self.state / "solution",
        }
        self.scratch = self.state / "tmp"
        self.venv: Path | None = None
        limits = SandboxLimits(memory_mb=spec.memory_mb) if spec.memory_mb else None
        self.sandbox = Sandbox(True, network=spec.network, limits=limits)
        self.online = Sandbox(True, network=True, limits=limits)  # for a cmd: agent that must reach its model

    # -- life ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        if not self.sandbox.active:
            raise InfraError(f"--env local runs every command in bubblewrap, which cannot run here: "
                             f"{self.sandbox.reason} (install bubblewrap, or use --env docker)")  # fmt: skip
        for d in (self.logs / "agent", self.logs / "verifier", self.scratch):
            d.mkdir(parents=True, exist_ok=True)
        if self.spec.app_source is not None and not self.app_dir.exists():
            self.spec.app_source(self.app_dir)
        self.app_dir.mkdir(parents=True, exist_ok=True)
        if self.spec.setup or self.spec.python:
            self.venv = ensure_setup(self)

    def stop(self) -> None:
        """Nothing outlives a command (each runs in its own pid namespace), so there is nothing to stop."""

    # -- commands --------------------------------------------------------------------------------------------

    def child_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = scrubbed_env({**self.spec.env, **(extra or {})})
        first = str(self.venv / "bin") if self.venv else os.path.dirname(sys.executable)
        env["PATH"] = first + os.pathsep + env.get("PATH", os.defpath)
        if self.venv:
            env["VIRTUAL_ENV"] = str(self.venv)
            env.pop("PYTHONPATH", None)  # the task's environment: no path into glm5's packages
        if "HOME" not in {**self.spec.env, **(extra or {})}:  # the host's HOME is read-only inside: pip, caches
            env["HOME"] = str(self.scratch / "home")
            (self.scratch / "home").mkdir(parents=True, exist_ok=True)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the answer's diff
        return env

    def wrap(self, argv: list[str], cwd: str = APP, sandbox: Sandbox | None = None) -> list[str]:
        binds = [(self.app_dir, APP), (self.logs, LOGS)]
        if self.spec.workdir not in (APP, "", "/") and not self.spec.workdir.startswith(
            ("/logs", "/tests", "/solution")
        ):
            binds.append((self.app_dir, self.spec.workdir))  # the same folder under the task's own name
        ro = [(self.hosts[m], m) for m in (TESTS, SOLUTION) if self.hosts[m].is_dir()]
        if self.venv:
            ro.append((self.venv, self.venv))
        sb = sandbox or self.sandbox
        # The sandbox keeps its root's .git and .glm5 read-only; a terminal task's /app may need a writable .git
        # (its tasks commit), so there the root is an empty folder of the trial and /app only a bind.
        root = self.app_dir if self.spec.protect_git else self.state / "root"
        root.mkdir(exist_ok=True)
        return mountable_root(sb.wrap(argv, root=root, cwd=Path(cwd), scratch=self.scratch,
                                      binds=binds, ro_binds=ro, hide=self.spec.hidden))  # fmt: skip

    def exec(self, command: str, *, cwd: str = APP, timeout_s: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None,
             network: bool | None = None) -> ExecResult:  # fmt: skip
        """`network` None: the environment's own setting (off unless the task allows it)."""
        sandbox = self.online if network and not self.spec.network else None
        argv = self.wrap(["bash", "-c", command], cwd, sandbox)
        return run_argv(argv, self.child_env(env), timeout_s, stdin, self.scratch)

    # -- files -----------------------------------------------------------------------------------------------

    def host_path(self, inside: str) -> Path:
        wd = self.spec.workdir
        if wd not in (APP, "", "/") and (inside == wd or inside.startswith(wd.rstrip("/") + "/")):
            inside = APP + inside[len(wd.rstrip("/")) :]
        for mount in (TESTS, SOLUTION, APP, LOGS):
            if inside == mount or inside.startswith(mount + "/"):
                rest = inside[len(mount) :].lstrip("/")
                p = (self.hosts[mount] / rest).resolve()
                if p != self.hosts[mount].resolve() and self.hosts[mount].resolve() not in p.parents:
                    raise ValueError(f"{inside} leaves {mount}")
                return p
        raise ValueError(f"{inside} is not under {', '.join(MOUNTS)}")

    def _mount_of(self, inside: str) -> tuple[Path, str]:
        """(the host folder of the mount holding `inside`, the rest of the path) without resolving anything."""
        wd = self.spec.workdir
        if wd not in (APP, "", "/") and (inside == wd or inside.startswith(wd.rstrip("/") + "/")):
            inside = APP + inside[len(wd.rstrip("/")) :]
        for mount in (TESTS, SOLUTION, APP, LOGS):
            if inside == mount or inside.startswith(mount + "/"):
                return self.hosts[mount], inside[len(mount) :].strip("/")
        raise ValueError(f"{inside} is not under {', '.join(MOUNTS)}")

    def copy_in(self, src: Path, dest: str) -> None:
        """Copy a host file or folder to `dest`. /app and /logs are the trial's to change: there each file is
        written from a descriptor of the mount's folder, never through a link a command left (host_files);
        /tests and /solution are the host's alone (read-only inside)."""
        root, rest = self._mount_of(dest)
        src = Path(src)
        if root in (self.hosts[TESTS], self.hosts[SOLUTION]):
            target = self.host_path(dest)
            if src.is_dir():
                shutil.copytree(src, target, dirs_exist_ok=True, symlinks=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
            return
        files = [(src, Path(rest))] if not src.is_dir() else [
            (p, Path(rest) / p.relative_to(src)) for p in sorted(src.rglob("*")) if p.is_file() and not p.is_symlink()
        ]  # fmt: skip
        for s, rel in files:
            if str(rel) in ("", "."):
                raise ValueError(f"{dest} is a mount, not a file")
            write_beneath(root, rel, s.read_bytes(), mode=s.stat().st_mode & 0o777)

    def copy_out(self, src: str, dest: Path) -> None:
        source = self.host_path(src)
        if source.is_dir():
            shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)
        elif source.exists():
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
