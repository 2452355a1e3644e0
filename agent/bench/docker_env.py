"""The `docker` environment: the task's image (or one built from its environment/Dockerfile), Harbor's paths.

/app and /logs are bind mounts of the trial's folders (so the agent's file tools, the patch capture and the
grader read the same files on the host); what the image itself put in /app is copied out first. /tests and
/solution are `docker cp`'d in when the trial gets there. Network off (`--network none`) unless the task allows
it; memory and CPUs from the task. Needs a running daemon: without one, start() says so (an infra error).
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from agent.bench.environments import APP, EnvSpec, ExecResult, InfraError
from agent.bench.local_env import run_argv
from agent.child_env import scrubbed_env


def docker_problem() -> str | None:
    """None when a Docker daemon answers, else why not."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        r = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                           timeout=20)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker info failed: {e}"
    if r.returncode != 0:
        return f"no Docker daemon answers: {(r.stderr or r.stdout).strip()[:200]}"
    return None


def _docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=scrubbed_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InfraError(f"docker {args[0]} failed: {e}") from None
    if r.returncode != 0:
        raise InfraError(f"docker {args[0]} failed: {(r.stderr or r.stdout).strip()[-400:]}")
    return r


class DockerEnvironment:
    name = "docker"

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self.state = Path(spec.trial_dir).resolve()
        self.app_dir = self.state / "app"
        self.logs = self.state / "logs"
        self.container: str | None = None

    def image(self) -> str:
        if self.spec.image:
            return self.spec.image
        ctx = self.spec.dockerfile_dir
        if ctx is None or not (Path(ctx) / "Dockerfile").is_file():
            raise InfraError("--env docker needs the task's image or an environment/Dockerfile")
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(ctx).rglob("*")) if p.is_file()))
        tag = f"glm5-bench:{digest.hexdigest()[:16]}"
        _docker("build", "-q", "-t", tag, str(ctx), timeout=3600)
        return tag

    def start(self) -> None:
        problem = docker_problem()
        if problem:
            raise InfraError(f"--env docker: {problem} (start the daemon, or use --env local)")
        for d in (self.logs / "agent", self.logs / "verifier"):
            d.mkdir(parents=True, exist_ok=True)
        image = self.image()
        if self.spec.app_source is not None and not self.app_dir.exists():
            self.spec.app_source(self.app_dir)
        elif not self.app_dir.exists():
            self.app_dir.mkdir(parents=True)
            probe = _docker("create", image, "true").stdout.strip()
            try:
                subprocess.run(
                    ["docker", "cp", f"{probe}:{APP}/.", str(self.app_dir)], capture_output=True, timeout=600
                )
            finally:
                subprocess.run(["docker", "rm", "-f", probe], capture_output=True, timeout=60)
        name = f"glm5-bench-{secrets.token_hex(4)}"
        argv = ["run", "-d", "--name", name, "-v", f"{self.app_dir}:{APP}", "-v", f"{self.logs}:/logs", "-w", APP]
        if not self.spec.network:
            argv += ["--network", "none"]
        if self.spec.memory_mb:
            argv += ["--memory", f"{self.spec.memory_mb}m"]
        if self.spec.cpus:
            argv += ["--cpus", str(self.spec.cpus)]
        _docker(*argv, image, "sleep", "infinity", timeout=600)
        self.container = name

    def wrap(self, argv: list[str], cwd: str = APP, env: dict[str, str] | None = None) -> list[str]:
        if self.container is None:
            raise InfraError("the docker environment is not started")
        flags = [f"--env={k}={v}" for k, v in {**self.spec.env, **(env or {})}.items()]
        return ["docker", "exec", "-i", "-w", cwd, *flags, self.container, *argv]

    def exec(self, command: str, *, cwd: str = APP, timeout_s: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult:  # fmt: skip
        argv = self.wrap(["bash", "-c", command], cwd, env)
        return run_argv(argv, scrubbed_env(), timeout_s, stdin, self.state / "tmp")

    @contextmanager
    def frozen(self):
        """Every process of the container paused (cgroup freezer) while the host works on /app or /logs: unlike
        the local environment, where nothing outlives a command, a process the agent or a test left running here
        could otherwise swap a file for a link under the host's git."""
        if self.container is None:
            yield
            return
        _docker("pause", self.container, timeout=120)
        try:
            yield
        finally:
            _docker("unpause", self.container, timeout=120)

    def copy_in(self, src: Path, dest: str) -> None:
        self.exec(f"mkdir -p {dest}", cwd="/")
        _docker("cp", f"{src}/." if Path(src).is_dir() else str(src), f"{self.container}:{dest}")

    def copy_out(self, src: str, dest: Path) -> None:
        _docker("cp", f"{self.container}:{src}", str(dest))

    def stop(self) -> None:
        if self.container:
            subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, timeout=120)
            self.container = None
