"""The OS sandbox for commands: bubblewrap on Linux.

Inside: an allowlist, not the host's disk: the system folders (/usr, /etc, ...) and the toolchains commands need
(this Python, PATH entries, folders the user adds with `[sandbox] read_only` or GLM5_SANDBOX_READ_ONLY) read-only,
an empty home folder, the repository and the session's scratch folder writable, a private /tmp,
network off unless allowed, no capabilities (as root, CAP_SYS_ADMIN would let a command remount `/` writable),
the process dies with the agent. Protected inside the writable repository, read-only: `.git` (and the real git
directory and common directory it points to: a command that could write git's config could make the host's git
run a filter or hook), and `.glm5/` (the permission rules and settings). Bench environments add their own binds
(`binds` / `ro_binds`); protected paths under a writable bind stay read-only there too. `limits` caps memory,
CPU time and file size (rlimits set inside, so they hold for everything the command starts). Hidden or
read-only as well: the user's credential files (~/.ssh, ~/.aws, .netrc, ...), /run (daemon sockets such as
docker.sock, which a read-only bind does not stop), and the host kernel's knobs under /proc/sys.

Where `bwrap` is missing or cannot create namespaces (some containers), commands run unsandboxed and `warning`
says so; the probe runs once per process.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from agent import host_path
from agent.config_dir import config_dir
from agent.git_safe import GitError, git

PROTECTED_NAMES = (".git", ".glm5")


@dataclass(frozen=True)
class SandboxLimits:
    memory_mb: int | None = None  # address space (RLIMIT_AS) of each process
    cpu_s: int | None = None  # CPU seconds (RLIMIT_CPU) of each process
    file_mb: int | None = None  # largest file a process may write (RLIMIT_FSIZE)
    open_files: int | None = None  # RLIMIT_NOFILE


def limit_argv(argv: list[str], limits: SandboxLimits | None) -> list[str]:
    """`argv` run under `limits` (bash's ulimit, then exec): rlimits are inherited by every child."""
    if limits is None:
        return argv
    parts = []
    if limits.memory_mb:
        parts.append(f"ulimit -v {int(limits.memory_mb) * 1024}")
    if limits.cpu_s:
        parts.append(f"ulimit -t {int(limits.cpu_s)}")
    if limits.file_mb:
        parts.append(f"ulimit -f {int(limits.file_mb) * 1024}")
    if limits.open_files:
        parts.append(f"ulimit -n {int(limits.open_files)}")
    if not parts:
        return argv
    return ["bash", "-c", " && ".join(parts) + ' && exec "$@"', "glm5-limits", *argv]


@lru_cache(maxsize=4)
def probe(network: bool) -> str | None:
    """None when bwrap works here, else why not."""
    exe = host_path.which("bwrap")
    if exe is None:
        return "bubblewrap (`bwrap`) is not installed"
    argv = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent", "--cap-drop", "ALL"]
    if not network:
        argv.append("--unshare-net")
    try:
        r = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start: {e}"
    if r.returncode != 0:
        return f"bwrap cannot create a sandbox here: {r.stderr.strip()[:200]}"
    return None


def git_dirs(root: Path) -> list[Path]:
    """The repository's `.git` entry, its real git directory and its common directory (worktrees share one)."""
    out = [root / ".git"]
    try:
        r = git(root, "rev-parse", "--absolute-git-dir", "--git-common-dir", check=False, timeout=30)
    except (GitError, subprocess.TimeoutExpired):
        return out
    if r.returncode == 0:
        for line in r.stdout.splitlines():
            p = Path(line.strip())
            if line.strip():
                p = p if p.is_absolute() else root / p
                out.append(Path(os.path.realpath(p)))
    seen: list[Path] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen


class Sandbox:
    def __init__(self, enabled: bool = True, network: bool = False, limits: SandboxLimits | None = None):
        self.network = network
        self.limits = limits
        self.reason = probe(network) if enabled else "the sandbox is turned off in settings"
        self.active = enabled and self.reason is None
        self._protected: dict[Path, list[Path]] = {}

    @property
    def warning(self) -> str | None:
        if self.active:
            return None
        return (
            f"WARNING: commands run WITHOUT a sandbox ({self.reason}); they can write anywhere this user can and "
            "reach the network. `glm5 doctor` shows what is missing."
        )

    def protected(self, root: Path) -> list[Path]:
        """Host paths that stay read-only inside even though they lie under a writable bind."""
        root = Path(root)
        if root not in self._protected:
            glm5 = root / ".glm5"
            # Created now so that a command cannot create it, with settings in it, before the next session.
            glm5.mkdir(exist_ok=True)
            self._protected[root] = [*git_dirs(root), glm5]
        return self._protected[root]

    def wrap(
        self,
        argv: list[str],
        root: Path,
        cwd: Path,
        scratch: Path,
        *,
        binds: Sequence[tuple[str | Path, str | Path]] = (),
        ro_binds: Sequence[tuple[str | Path, str | Path]] = (),
        limits: SandboxLimits | None = None,
        hide: Sequence[str | Path] = (),
        tty: bool = False,  # noqa: ARG002 - bubblewrap hands the caller's terminal through as it is
    ) -> list[str]:
        """`hide`: host folders (an empty tmpfs over each) and files (/dev/null over each) a command must not read,
        though the rest of the filesystem is readable: a benchmark's task files, with their gold patches. `tty`:
        the command runs on a terminal (a terminal session); another kind of sandbox must give it one."""
        root = Path(root)
        # found now, not at start, and never in a folder commands write (an active .venv/bin in the repository)
        exe = host_path.which("bwrap") or "/usr/bin/bwrap"
        # An allowlist over an empty root, not the host's `/` with a few things masked: the system folders
        # read-only, the toolchains commands need (this Python, PATH, what the user configured), the
        # repository and scratch below; the home directory is an empty folder and the rest of the disk absent.
        out = [exe, *system_view(), "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        home = os.path.expanduser("~")
        if home not in ("/", "") and not any(Path(home).is_relative_to(d) for d in SYSTEM_DIRS):
            out += ["--dir", home]
        # The new /proc still reaches the host kernel's knobs, and uid 0 may write them without capabilities
        # (kernel sysctls, /proc/sysrq-trigger): read-only.
        # Daemons' sockets live under /run (docker.sock is root on the host, dbus, containerd, podman): a read-only
        # bind does not stop connect(), so /run is an empty tmpfs, keeping only the resolver's files.
        out += ["--tmpfs", "/run", "--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve"]
        out += ["--ro-bind", "/proc/sys", "/proc/sys"]
        if os.path.exists("/proc/sysrq-trigger"):
            out += ["--ro-bind", "/dev/null", "/proc/sysrq-trigger"]
        # Bind after the tmpfs so a repository or scratch folder under /tmp stays visible and writable.
        # Toolchains under /tmp (a virtual environment, PATH entries) stay visible, read-only, over the private /tmp.
        for tool_dir in toolchain_dirs():
            out += ["--ro-bind-try", tool_dir, tool_dir]
        for p in _etc_secrets():  # visible under /etc, readable to a root user: masked
            out += ["--tmpfs", p] if os.path.isdir(p) else ["--ro-bind", "/dev/null", p]
        for p in map(Path, hide):  # before the binds below, which may lie inside a hidden folder
            if p.is_dir() and not p.is_symlink():
                out += ["--tmpfs", str(p)]
            elif p.is_file() and not p.is_symlink():
                out += ["--ro-bind", "/dev/null", str(p)]
        writable = [(root, root), *((Path(h), Path(i)) for h, i in binds)]
        for host, inside in writable:
            out += ["--bind", str(host), str(inside)]
        for host, inside in ro_binds:
            out += ["--ro-bind", str(host), str(inside)]
        # Protected paths, read-only wherever a writable bind exposes them (the repository at its own path, or
        # mapped to /app by a bench environment); and at their own path, where a worktree's git directory lies
        # outside the repository (under /tmp it would otherwise be hidden by the private /tmp).
        for p in self.protected(root):
            if not (p.exists() or p.is_symlink()):
                continue
            places = {p}
            for host, inside in writable:
                if p == host or Path(host) in p.parents:
                    places.add(Path(inside) / p.relative_to(host))
            for place in sorted(places):
                out += ["--ro-bind", str(p), str(place)]
        out += ["--bind", str(scratch), str(scratch)]
        # Credentials stay unreadable even to allowed commands: with the network off a key could still leave
        # through the model's context (to a hosted provider).
        for p in _credential_paths():
            out += ["--tmpfs", p] if os.path.isdir(p) else ["--ro-bind", "/dev/null", p]
        # A pid namespace: killing bwrap at a timeout takes every process the command started with it.
        # No capabilities: root inside could otherwise remount the read-only binds writable.
        out += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
        out += ["--cap-drop", "ALL", "--chdir", str(cwd)]
        if not self.network:
            out.append("--unshare-net")
        return [*out, "--", *limit_argv(argv, limits or self.limits)]


CREDENTIALS = (".ssh", ".aws", ".gnupg", ".kube", ".docker", ".azure", ".config/gcloud", ".config/gh",
               ".netrc", ".git-credentials", ".pypirc", ".npmrc", ".cargo/credentials.toml", ".config/glm5")  # fmt: skip


def _credential_paths() -> list[str]:
    """The user's credential files and folders that exist (masked inside the sandbox)."""
    homes = {os.path.expanduser("~"), os.environ.get("HOME") or ""}
    out = []
    for home in sorted(h for h in homes if h and os.path.isdir(h)):
        for name in CREDENTIALS:
            p = os.path.join(home, name)
            if os.path.lexists(p) and not os.path.islink(p):
                out.append(p)
    return out


# What every command sees read-only: the OS's own folders (top-level links such as /bin -> usr/bin kept as links).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix", "/sys")
ETC_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
               "/etc/ssl/private", "/etc/security/opasswd")  # fmt: skip
HOME_SHARED = (".local", ".config", ".cache", ".share")  # home folders holding more than one tool: entries only
READ_ONLY_ENV = "GLM5_SANDBOX_READ_ONLY"  # more read-only folders, os.pathsep-separated (the user's environment)


def system_view() -> list[str]:
    """bwrap arguments for the system folders: read-only binds, and links for the top-level entries that are
    links (a merged /usr)."""
    out: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            out += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            out += ["--ro-bind", d, d]
    return out


def _etc_secrets() -> list[str]:
    keys = [str(p) for p in Path("/etc/ssh").glob("ssh_host_*key")] if os.path.isdir("/etc/ssh") else []
    return [p for p in (*ETC_SECRETS, *keys) if os.path.lexists(p) and not os.path.islink(p)]


def configured_read_only() -> list[str]:
    """Folders the user added to the view: `[sandbox] read_only = [...]` in their own config file (never a
    repository's) and GLM5_SANDBOX_READ_ONLY."""
    out = [p for p in os.environ.get(READ_ONLY_ENV, "").split(os.pathsep) if p]
    try:
        f = config_dir() / "config.toml"
        if f.is_file():
            extra = (tomllib.loads(f.read_text(encoding="utf-8")).get("sandbox") or {}).get("read_only") or []
            out += [str(p) for p in extra if isinstance(p, str)] if isinstance(extra, list) else []
    except (OSError, ValueError):
        pass
    return out


def toolchain_dirs() -> list[str]:
    """What commands need to find and run programs, read-only: this Python's prefixes, its user site, the PATH
    entries, and the folders the user configured. Never `/`, the home folder itself or one above it (that would
    be the whole home), nor a credential folder."""
    home = Path(os.path.expanduser("~")).resolve()
    candidates = [sys.prefix, sys.base_prefix, site.getusersitepackages(), *os.environ.get("PATH", "").split(os.pathsep),
                  *configured_read_only()]  # fmt: skip
    creds = [Path(p).resolve() for p in _credential_paths()]
    out = set()
    for c in candidates:
        if not c or not os.path.isabs(c) or not os.path.isdir(c):
            continue
        p = Path(c).resolve()
        if p.name in ("bin", "sbin", "shims") and p.parent.name not in HOME_SHARED and p.parent != home:
            p = p.parent  # the toolchain's root: ~/.pyenv for ~/.pyenv/shims (the shims run ~/.pyenv/libexec)
        if p == Path("/") or p == home or home.is_relative_to(p) or any(p.is_relative_to(x) for x in creds):
            continue  # (credential files inside a toolchain's root are masked after the binds)
        if any(p.is_relative_to(d) for d in SYSTEM_DIRS if not os.path.islink(d)):
            continue  # already in the view
        out.add(str(p))
    return sorted(out)
