"""A Docker daemon and glm5's offline base image for the docker-mode tests.

Where a daemon already answers (DOCKER_HOST, /var/run/docker.sock), the tests use it. Else, as root with `dockerd`
installed (scripts/setup.sh installs Debian's docker.io where it can), they start a private one: its data, its
socket and its pid under GLM5_TEST_DOCKER_ROOT (default /tmp/glm5-test-docker), DOCKER_HOST pointing at it. Every
session that uses that daemon leaves a file named by its pid in ROOT/sessions; the last one to end stops a daemon
the tests started (a session ending while another still runs docker tests leaves it up; the next start costs
seconds; the base image stays in its data). The base image is
built offline by scripts/build_base_image.sh (debootstrap from the Debian mirror, then `docker import`) and
cached. Every failure to get there is a skip reason that says what is missing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from agent.bench.docker_env import BASE_IMAGE, cli_env, docker_problem

ROOT = Path(os.environ.get("GLM5_TEST_DOCKER_ROOT", "/tmp/glm5-test-docker"))
REPO = Path(__file__).resolve().parents[3]
_state: dict[str, str | None] = {}
_children: list[subprocess.Popen] = []


SESSIONS = ROOT / "sessions"  # a file per live pytest session on the private daemon, named by its pid
STARTED = ROOT / "started-by-tests"  # the private daemon is the tests' own: the last session out stops it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _join() -> None:
    SESSIONS.mkdir(parents=True, exist_ok=True)
    (SESSIONS / str(os.getpid())).touch()
    atexit.register(_leave)


def _leave() -> None:
    """This session is done with the daemon; the last one out stops it if the tests started it."""
    (SESSIONS / str(os.getpid())).unlink(missing_ok=True)
    if any(p.name.isdigit() and _alive(int(p.name)) for p in SESSIONS.iterdir()) or not STARTED.exists():
        return
    try:
        pid = int((ROOT / "dockerd.pid").read_text())
    except (OSError, ValueError):
        return
    STARTED.unlink(missing_ok=True)
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _start_private_daemon() -> str | None:
    sock = ROOT / "docker.sock"
    os.environ["DOCKER_HOST"] = f"unix://{sock}"
    if docker_problem() is None:
        _join()  # started by an earlier session that may still be running
        return None
    for d in ("data", "exec"):
        (ROOT / d).mkdir(parents=True, exist_ok=True)
    log = open(ROOT / "dockerd.log", "ab")  # noqa: SIM115 - the daemon keeps writing it
    proc = subprocess.Popen(["dockerd", "--data-root", str(ROOT / "data"), "--exec-root", str(ROOT / "exec"),
                             "-H", f"unix://{sock}", "--pidfile", str(ROOT / "dockerd.pid")],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    _children.append(proc)  # kept: it outlives this session when another still uses it
    STARTED.touch()
    _join()  # stopped by the last session out (its images stay in data/)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if docker_problem() is None:
            return None
        time.sleep(1)
    tail = (ROOT / "dockerd.log").read_text(errors="replace")[-400:]
    return f"dockerd did not start: {tail}"


def daemon() -> str | None:
    """None when a daemon answers (started now if need be), else why none can run here."""
    if "daemon" in _state:
        return _state["daemon"]
    why = docker_problem()
    if why is not None:
        if shutil.which("dockerd") is None:
            why = f"{why}; dockerd is not installed (scripts/setup.sh installs docker.io as root with apt)"
        elif os.geteuid() != 0:
            why = f"{why}; starting dockerd needs root"
        else:
            why = _start_private_daemon()
    _state["daemon"] = why
    return why


def base_image() -> str | None:
    """None when BASE_IMAGE is there (built now if need be), else why not."""
    if "base" in _state:
        return _state["base"]
    why = daemon()
    if why is None:
        have = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, env=cli_env())
        if have.returncode != 0:
            r = subprocess.run([str(REPO / "scripts" / "build_base_image.sh"), BASE_IMAGE], capture_output=True,
                               text=True, timeout=1800, env={**os.environ, **cli_env()})  # fmt: skip
            why = None if r.returncode == 0 else f"the base image did not build: {(r.stderr or r.stdout)[-400:]}"
    _state["base"] = why
    return why


def tag(image: str, as_: str) -> None:
    """Make `as_` name `image` where no image has that name (a Dockerfile's FROM, offline)."""
    have = subprocess.run(["docker", "image", "inspect", as_], capture_output=True, env=cli_env())
    if have.returncode != 0:
        subprocess.run(["docker", "tag", image, as_], check=True, capture_output=True, env=cli_env())


def containers(prefix: str = "glm5-bench-") -> list[str]:
    r = subprocess.run(["docker", "ps", "-a", "--filter", f"name={prefix}", "--format", "{{.Names}}"],
                       capture_output=True, text=True, env=cli_env())  # fmt: skip
    return r.stdout.split()
