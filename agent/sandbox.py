"""The OS sandbox for commands: bubblewrap on Linux.

Inside: the whole filesystem read-only, the repository (but not its `.glm5/` settings) and the session's scratch
folder writable, a private /tmp, network off unless allowed, the process dies with the agent. Where `bwrap` is missing or cannot create
namespaces (some containers), commands run unsandboxed and `warning` says so; the probe runs once per process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=4)
def probe(network: bool) -> str | None:
    """None when bwrap works here, else why not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap (`bwrap`) is not installed"
    argv = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent"]
    if not network:
        argv.append("--unshare-net")
    try:
        r = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start: {e}"
    if r.returncode != 0:
        return f"bwrap cannot create a sandbox here: {r.stderr.strip()[:200]}"
    return None


class Sandbox:
    def __init__(self, enabled: bool = True, network: bool = False):
        self.network = network
        self.reason = probe(network) if enabled else "the sandbox is turned off in settings"
        self.active = enabled and self.reason is None

    @property
    def warning(self) -> str | None:
        if self.active:
            return None
        return f"commands run WITHOUT a sandbox ({self.reason}); they can write anywhere this user can."

    def wrap(self, argv: list[str], root: Path, cwd: Path, scratch: Path) -> list[str]:
        out = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        # Bind after the tmpfs so a repository or scratch folder under /tmp stays visible and writable. glm5's own
        # folder is read-only inside (a command must not rewrite the permission rules), except the scratch folder.
        # Toolchains under /tmp (a virtual environment, PATH entries) stay visible, read-only, over the private /tmp.
        for tool_dir in _tmp_tool_dirs():
            out += ["--ro-bind-try", tool_dir, tool_dir]
        out += ["--bind", str(root), str(root)]
        if (root / ".glm5").is_dir():
            out += ["--ro-bind", str(root / ".glm5"), str(root / ".glm5")]
        out += ["--bind", str(scratch), str(scratch)]
        # A pid namespace: killing bwrap at a timeout takes every process the command started with it.
        out += ["--unshare-pid", "--die-with-parent", "--new-session", "--chdir", str(cwd)]
        if not self.network:
            out.append("--unshare-net")
        return [*out, "--", *argv]


def _tmp_tool_dirs() -> list[str]:
    """Folders under /tmp that commands need to find programs: this Python's prefixes and PATH entries."""
    candidates = {sys.prefix, sys.base_prefix, *os.environ.get("PATH", "").split(os.pathsep)}
    out = set()
    for c in candidates:
        if c and os.path.isabs(c) and Path(c).resolve().is_relative_to("/tmp") and Path(c).is_dir():
            out.add(str(Path(c).resolve()))
    return sorted(out)
