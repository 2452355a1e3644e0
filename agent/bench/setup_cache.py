"""A task's setup, run once per repository and version into a cached virtual environment.

`setup` is a command (run in /app with the venv active) or a requirements file (`pip install -r`). The venv is
made from the task's Python (`python = "3.9"`, or its Dockerfile's `python=3.9`) where this machine has that
version (PATH, pyenv, uv), else from the Python that runs glm5; a task that asks for a version the machine lacks
fails with "needs Python 3.9: use --env docker, or install it". The venv is the task's alone: its own pip, no path
into glm5's site-packages (glm5's pytest plugins would load into the task's pytest). The setup runs in the sandbox
with the network on and the venv, a HOME and pip's cache writable; trials then get the venv read-only.
What the setup generated in the checkout (`pip install -e .` writes src/pkg/_version.py, egg-info, built
extensions: files git does not track) is kept as a tarball beside the venv and unpacked into every later trial's
/app, inside the sandbox, so the graded checkout has them too.
Keyed by (setup_key, setup text, Python version); a lock file makes concurrent trials wait for the first, and a
`done` marker written last means a killed setup is redone, never half-used.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.bench.environments import APP, InfraError
from agent.bench.process import run_argv
from agent.git_safe import GitError, git
from agent.sandbox import Sandbox

SETUP_TIMEOUT_S = 3600.0
GENERATED = "generated.tar"  # the untracked files the setup left in /app


def setup_command(setup: str, app_dir: Path) -> str:
    s = setup.strip()
    if " " not in s and s.endswith(".txt") and (app_dir / s).is_file():
        return f"python -m pip install -q -r {s}"
    return s


def _version_of(exe: str) -> str | None:
    try:
        r = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                           text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def python_candidates(version: str) -> list[str]:
    """Where an interpreter of `version` may be: PATH, pyenv's versions, uv's managed Pythons, /usr/local, /opt."""
    home = os.path.expanduser("~")
    pyenv = os.environ.get("PYENV_ROOT") or os.path.join(home, ".pyenv")
    out = [shutil.which(f"python{version}") or ""]
    for pattern in (f"{pyenv}/versions/{version}*/bin/python{version}",
                    f"{home}/.local/share/uv/python/cpython-{version}*/bin/python{version}",
                    f"/usr/local/bin/python{version}", f"/usr/bin/python{version}",
                    f"/opt/python/{version}*/bin/python{version}",
                    f"/opt/conda/envs/*/bin/python{version}"):  # fmt: skip
        out += sorted(glob.glob(pattern), reverse=True)
    return [p for p in dict.fromkeys(out) if p]


def find_python(version: str | None) -> str:
    """An interpreter of the task's Python `version` (glm5's own when the task names none)."""
    if not version:
        return sys.executable
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return sys.executable
    for exe in python_candidates(version):
        if _version_of(exe) == version:
            return exe
    raise InfraError(f"the task needs Python {version}, which this machine does not have: use --env docker, or "
                     f"install it (pyenv install {version}, uv python install {version}, or apt-get install "
                     f"python{version})")  # fmt: skip


def missing_pythons(tasks: list[Any]) -> dict[str, list[str]]:
    """version -> ids of the tasks that need a Python this machine lacks (checked before a local run starts)."""
    out: dict[str, list[str]] = {}
    found: dict[str, bool] = {}
    for t in tasks:
        v = getattr(t, "python", "") or ""
        if v and v not in found:
            try:
                find_python(v)
                found[v] = True
            except InfraError:
                found[v] = False
        if v and not found[v]:
            out.setdefault(v, []).append(t.task_id)
    return out


def _make_venv(python: str, venv: Path) -> None:
    r = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise InfraError(f"could not create the setup venv with {python}: {(r.stderr or r.stdout).strip()[-300:]}")


def ensure_setup(env: Any) -> Path:
    """The venv for `env.spec`'s setup, built now if no finished one is cached; raises InfraError if it fails."""
    spec = env.spec
    python = find_python(spec.python)
    cache = Path(spec.cache_dir or env.state / "cache") / "setups"
    key = hashlib.sha256(f"{spec.setup_key}\0{spec.setup}\0{spec.python or ''}".encode()).hexdigest()[:16]
    folder = cache / key
    venv = folder / "venv"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "done").exists():
            env.venv = venv
            restore_generated(env, folder)
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        (folder / GENERATED).unlink(missing_ok=True)
        _make_venv(python, venv)
        env.venv = venv
        _run_setup(env, folder)
        (folder / "done").write_text(spec.setup or "")
    return venv


def _run_setup(env: Any, folder: Path) -> None:
    """The setup command in the sandbox (network on; the venv, HOME, pip's cache and `folder` writable), then the
    files it generated in /app packed into folder/generated.tar."""
    spec, venv = env.spec, env.venv
    home, pip_cache = folder / "home", Path(spec.cache_dir or env.state / "cache") / "pip"
    for d in (home, pip_cache):
        d.mkdir(parents=True, exist_ok=True)
    child = env.child_env({"HOME": str(home), "PIP_CACHE_DIR": str(pip_cache), "XDG_CACHE_HOME": str(home / ".cache"),
                           "PIP_DISABLE_PIP_VERSION_CHECK": "1"})  # fmt: skip
    pack = f"git ls-files -z --others | tar --null -T - -cf {folder / GENERATED}"
    script = f"set -e\n{setup_command(spec.setup or 'true', env.app_dir)}\n{pack}\n"
    argv = env.wrap(["bash", "-c", script], APP, Sandbox(True, network=True))
    i = argv.index("--")  # writable for the setup only: binds over their read-only entries
    extra = [a for d in (venv, folder, pip_cache) for a in ("--bind", str(d), str(d))]
    argv = [*argv[:i], *extra, *argv[i:]]
    res = run_argv(argv, child, SETUP_TIMEOUT_S, None, env.scratch)
    (folder / "setup.log").write_text(res.output)
    if res.returncode != 0:
        env.venv = None
        raise InfraError(f"the task's setup failed (exit {res.returncode}); see {folder / 'setup.log'}: "
                         f"{res.output.strip()[-300:]}")  # fmt: skip
    exclude_generated(env.app_dir)


def exclude_generated(app_dir: Path) -> None:
    """What the setup generated in the checkout (files git does not track) is the environment's, not the answer's:
    listed in the checkout's .git/info/exclude so the prediction (working_tree_diff) leaves it out, and applying
    that prediction where the same files were restored cannot collide with them."""
    dotgit = Path(app_dir) / ".git"
    if dotgit.is_symlink() or not dotgit.is_dir():
        return
    try:
        out = git(Path(app_dir), "ls-files", "-z", "--others", "--exclude-standard", timeout=300).stdout
    except GitError:
        return
    paths = [p for p in out.split("\0") if p]
    if not paths:
        return
    lines = ["/" + re.sub(r"([\\*?\[!# ])", r"\\\1", p) for p in paths]  # exact paths, glob characters escaped
    text = "# generated by the task's setup (glm5 bench)\n" + "\n".join(lines) + "\n"
    # each step by descriptor, never following a link: in docker mode the setup (and what it left running) can
    # write /app/.git, and a .git/info swapped for a link would aim this host-side append at any host file
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        git_fd = os.open(dotgit, flags)
    except OSError:
        return
    try:
        try:
            os.mkdir("info", 0o755, dir_fd=git_fd)
        except FileExistsError:
            pass
        info_fd = os.open("info", flags, dir_fd=git_fd)
        try:
            fd = os.open("exclude", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=info_fd)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(text)
        finally:
            os.close(info_fd)
    except OSError:
        return  # not a folder, or a link: the generated files stay in the diff, where grading will show them
    finally:
        os.close(git_fd)


def restore_generated(env: Any, folder: Path) -> None:
    """Unpack what the first setup generated into this trial's /app; tar runs in the sandbox, so a hostile
    archive member (../, an absolute path, a link out) can write nothing but /app."""
    tarball = folder / GENERATED
    if not tarball.is_file() or tarball.stat().st_size == 0:
        return
    argv = env.wrap(["tar", "--no-same-owner", "-xf", str(tarball), "-C", APP], APP)
    i = argv.index("--")
    argv = [*argv[:i], "--ro-bind", str(folder), str(folder), *argv[i:]]
    res = run_argv(argv, env.child_env(), 600, None, env.scratch)
    if res.returncode != 0:
        raise InfraError(f"could not restore the files the setup generated: {res.output.strip()[-300:]}")
    exclude_generated(env.app_dir)
