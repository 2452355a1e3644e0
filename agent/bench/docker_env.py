"""The `docker` environment: the task's image (or one built from its environment/Dockerfile), Harbor's paths.

/app and /logs are bind mounts of the trial's folders (so the agent's file tools, the patch capture and the
grader read the same files on the host); what the image itself put in its working folder (/app, or /testbed in
the SWE-bench harness's `sweb.eval.x86_64.<id>` images, where the repository is installed) is copied out first and
bound at both paths. A task's `setup` runs in the container before the agent, with the network on, which is then
cut (docker network disconnect). A SWE task with no image of its own runs in BASE_IMAGE (scripts/build_base_image.sh builds
it offline from Debian packages). /tests and
/solution are `docker cp`'d in when the trial gets there. Network off (`--network none`) unless the task allows
it; memory and CPUs from the task. Needs a running daemon: without one, start() says so (an infra error).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from agent.bench.environments import APP, EnvSpec, ExecResult, InfraError
from agent.bench.process import run_argv
from agent.bench.setup_cache import SETUP_TIMEOUT_S, exclude_generated, setup_command
from agent.child_env import scrubbed_env

BASE_IMAGE = os.environ.get("GLM5_BENCH_BASE_IMAGE", "glm5-bench-base:bookworm")
# the docker CLI's own settings (which daemon, its TLS, its config with registry logins); never a container's env
DOCKER_VARS = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


def cli_env() -> dict[str, str]:
    return scrubbed_env(pass_env=DOCKER_VARS)


def docker_problem() -> str | None:
    """None when a Docker daemon answers, else why not."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        r = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                           timeout=20, env=cli_env())  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker info failed: {e}"
    if r.returncode != 0:
        return f"no Docker daemon answers: {(r.stderr or r.stdout).strip()[:200]}"
    return None


def _docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=cli_env())
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

    @property
    def label(self) -> str:
        """Names this trial's containers: a run killed mid-trial leaves one running, which the retry removes."""
        return f"glm5.bench.trial={hashlib.sha256(str(self.state).encode()).hexdigest()[:16]}"

    def _remove_leftovers(self) -> None:
        r = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={self.label}"], capture_output=True,
                           text=True, timeout=60, env=cli_env())  # fmt: skip
        if r.returncode == 0 and r.stdout.split():
            subprocess.run(["docker", "rm", "-f", *r.stdout.split()], capture_output=True, timeout=120, env=cli_env())

    @property
    def harness_image(self) -> bool:
        """The SWE-bench harness's image: the repository is its /testbed (installed there), not a checkout of ours."""
        return self.spec.app_source is None and self.spec.workdir == "/testbed"

    @property
    def workdir(self) -> str:
        return self.spec.workdir if self.spec.workdir not in ("", "/") else APP

    def image(self) -> str:
        if self.spec.image:
            if self.spec.image.startswith("-"):  # `docker run` would read it as a flag (--privileged)
                raise InfraError(f"{self.spec.image[:80]!r} is not a Docker image reference")
            ctx = self.spec.dockerfile_dir
            if ctx is not None and (Path(ctx) / "Dockerfile").is_file() and not self._available(self.spec.image):
                # as the harness does before it evaluates: build the named image from the task's Dockerfile
                _docker("build", "-q", "-t", self.spec.image, str(ctx), timeout=3600)
            return self.spec.image
        ctx = self.spec.dockerfile_dir
        if ctx is None or not (Path(ctx) / "Dockerfile").is_file():
            raise InfraError("--env docker needs the task's image or an environment/Dockerfile")
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(ctx).rglob("*")) if p.is_file()))
        tag = f"glm5-bench:{digest.hexdigest()[:16]}"
        _docker("build", "-q", "-t", tag, str(ctx), timeout=3600)
        return tag

    @staticmethod
    def _available(image: str) -> bool:
        """The image is here, or the registry has it (pulled now)."""
        for args in (("image", "inspect", image), ("pull", "-q", image)):
            r = subprocess.run(["docker", *args], capture_output=True, timeout=1800, env=cli_env())
            if r.returncode == 0:
                return True
        return False

    def start(self) -> None:
        problem = docker_problem()
        if problem:
            raise InfraError(f"--env docker: {problem} (start the daemon, or use --env local)")
        for d in (self.logs / "agent", self.logs / "verifier"):
            d.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()
        image = self.image()
        if self.spec.app_source is not None and not self.app_dir.exists():
            self.spec.app_source(self.app_dir)
        elif not self.app_dir.exists():
            self.app_dir.mkdir(parents=True)
            probe = _docker("create", "--label", self.label, image, "true").stdout.strip()
            try:  # what the image holds at the task's working folder (/app; /testbed in the harness's images)
                subprocess.run(["docker", "cp", f"{probe}:{self.workdir}/.", str(self.app_dir)], capture_output=True,
                               timeout=1800, env=cli_env())  # fmt: skip
            finally:
                subprocess.run(["docker", "rm", "-f", probe], capture_output=True, timeout=60, env=cli_env())
        name = f"glm5-bench-{secrets.token_hex(4)}"
        argv = ["run", "-d", "--name", name, "--label", self.label, "-v", f"{self.app_dir}:{APP}",
                "-v", f"{self.logs}:/logs"]  # fmt: skip
        if self.workdir != APP:  # the same folder under the task's own name
            argv += ["-v", f"{self.app_dir}:{self.workdir}"]
        argv += ["-w", self.workdir]
        # a task's setup (its dependencies) runs with the network on, then the container is cut off
        setup_online = bool(self.spec.setup) and not self.spec.network
        if not self.spec.network and not setup_online:
            argv += ["--network", "none"]
        if self.spec.memory_mb:
            argv += ["--memory", f"{self.spec.memory_mb}m"]
        if self.spec.cpus:
            argv += ["--cpus", str(self.spec.cpus)]
        _docker(*argv, image, "sleep", "infinity", timeout=600)
        self.container = name
        if self.spec.setup:
            self._setup(setup_online)

    def _setup(self, cut_off_after: bool) -> None:
        """The task's setup in the container (each trial's: its files land in this checkout), then no network."""
        res = self.exec(setup_command(self.spec.setup or "", self.app_dir), cwd=self.workdir,
                        timeout_s=SETUP_TIMEOUT_S)  # fmt: skip
        if cut_off_after:
            nets = _docker("inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
                           self.container).stdout.split()  # fmt: skip
            for net in nets:
                _docker("network", "disconnect", "-f", net, self.container)
        if res.returncode != 0:
            raise InfraError(f"the task's setup failed in the container (exit {res.returncode}): "
                             f"{res.output.strip()[-300:]}")  # fmt: skip
        exclude_generated(self.app_dir)

    def wrap(self, argv: list[str], cwd: str = APP, env: dict[str, str] | None = None, tty: bool = False) -> list[str]:
        """`argv` run in the container; `tty`: on a terminal of its own there (-t: a terminal session's program,
        whose docker CLI runs on glm5's pty and passes its size and keys through)."""
        if self.container is None:
            raise InfraError("the docker environment is not started")
        flags = [f"--env={k}={v}" for k, v in {**self.spec.env, **(env or {})}.items()]
        # the daemon named in argv: whoever runs it (the glm5 agent's tools, with their scrubbed environment) may
        # not have DOCKER_HOST
        host = ["-H", os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else []
        if tty and argv and os.path.basename(argv[0]) == "setsid":
            # docker exec -t already starts the program as its session's leader on the container's terminal, which
            # setsid -c cannot take again (EPERM): the terminal session's setsid is not needed there
            argv = argv[1:]
            while argv and argv[0].startswith("-"):
                argv = argv[1:]
        return ["docker", *host, "exec", "-it" if tty else "-i", "-w", cwd, *flags, self.container, *argv]

    def exec(self, command: str, *, cwd: str = APP, timeout_s: float | None = None,
             env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult:  # fmt: skip
        argv = self.wrap(["bash", "-c", command], cwd, env)
        return run_argv(argv, cli_env(), timeout_s, stdin, self.state / "tmp")

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
            subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, timeout=120, env=cli_env())
            self.container = None
