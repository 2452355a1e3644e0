"""A task's setup, run once per repository and version into a cached virtual environment.

`setup` is a command (run in /app with the venv active) or a requirements file (`pip install -r`). The venv
is made from the Python that runs glm5, without a pip of its own (the parent's pip installs into it), and sees
that Python's packages (a .pth line), so a task installs only what it adds. The setup runs in the sandbox with
the network on (it installs packages) and the venv
writable; trials then get the venv read-only. Keyed by (setup_key, setup text); a lock file makes concurrent
trials wait for the first, and a `done` marker written last means a killed setup is redone, never half-used.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.bench.environments import APP, InfraError
from agent.sandbox import Sandbox

SETUP_TIMEOUT_S = 3600.0


def setup_command(setup: str, app_dir: Path) -> str:
    s = setup.strip()
    if " " not in s and s.endswith(".txt") and (app_dir / s).is_file():
        return f"python -m pip install -q -r {s}"
    return s


def ensure_setup(env: Any) -> Path:
    """The venv for `env.spec`'s setup, built now if no finished one is cached; raises InfraError if it fails."""
    spec = env.spec
    cache = Path(spec.cache_dir or env.state / "cache") / "setups"
    key = hashlib.sha256(f"{spec.setup_key}\0{spec.setup}".encode()).hexdigest()[:16]
    folder = cache / key
    venv = folder / "venv"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "done").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        r = subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True, timeout=600
        )
        if r.returncode != 0:
            raise InfraError(f"could not create the setup venv: {r.stderr.strip()[-300:]}")
        lib = next((venv / "lib").glob("python*/site-packages"))
        (lib / "_glm5_parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        env.venv = venv
        online = Sandbox(True, network=True)
        sb_argv_env = env.child_env()
        argv = env.wrap(["bash", "-c", setup_command(spec.setup, env.app_dir)], APP, online)
        # the venv is writable for the setup only: bind it over its read-only entry
        i = argv.index("--")
        argv = [*argv[:i], "--bind", str(venv), str(venv), *argv[i:]]
        from agent.bench.local_env import run_argv

        res = run_argv(argv, sb_argv_env, SETUP_TIMEOUT_S, None, env.scratch)
        (folder / "setup.log").write_text(res.output)
        if res.returncode != 0:
            env.venv = None
            raise InfraError(f"the task's setup failed (exit {res.returncode}); see {folder / 'setup.log'}: "
                             f"{res.output.strip()[-300:]}")  # fmt: skip
        (folder / "done").write_text(spec.setup or "")
    return venv
