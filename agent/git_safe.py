"""Host-side git that runs nothing a repository (or a sandboxed command) could have configured.

Git runs programs named in its configuration: filter drivers (`filter.<x>.clean/smudge/process`, chosen per
file by `.gitattributes`), `core.fsmonitor`, hooks (`core.hooksPath`, `.git/hooks/*`, the reference-transaction
hook that `update-ref` fires), `diff.external`, textconv, merge drivers, `core.sshCommand`, askpass, pagers,
editors, credential helpers, gpg. Configuration comes from files a hostile repository controls (`.git/config`,
`include.path` targets inside the working tree), so every host-side git call in glm5 goes through `git()` here:

- the effective configuration is listed first (`git config --list`, which reads files and runs nothing) and every
  key that names a program is overridden to empty through GIT_CONFIG_COUNT / GIT_CONFIG_KEY_n (environment, not
  `-c`, so a subsection holding `=` cannot break the override); overrides outrank every file, includes too;
- fixed overrides turn off hooks, fsmonitor, automatic gc, submodule recursion, the `ext::` transport, signing;
- the child gets a scrubbed environment without inherited GIT_* variables, no pager, no prompt, no editor.

The sandbox also binds `.git` read-only (agent/sandbox.py); this is the second fence, for repositories that
arrived already hostile and for sessions with the sandbox off.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from agent import host_path

# Keys whose values git runs as commands (matched on the lower-cased key's last part, or the whole key).
_PROGRAM_LEAVES = {
    "clean", "smudge", "process", "textconv", "command", "driver", "cmd", "program", "helper",
    "sshcommand", "askpass", "pager", "editor", "fsmonitor", "hookspath", "gitproxy", "alternaterefscommand",
    "receivepack", "uploadpack", "external", "packobjectshook", "proxycommand",
}  # fmt: skip
_FIXED = {
    "core.hooksPath": "/dev/null",
    "core.fsmonitor": "false",
    "core.pager": "cat",
    "core.editor": "true",
    "sequence.editor": "true",
    "core.sshCommand": "false",
    "core.askPass": "",
    "credential.helper": "",
    "diff.external": "",
    "gc.auto": "0",
    "maintenance.auto": "false",
    "submodule.recurse": "false",
    "protocol.ext.allow": "never",
    "commit.gpgSign": "false",
    "tag.gpgSign": "false",
    "safe.bareRepository": "explicit",
}
# What git itself needs from the host environment; everything else (GIT_DIR, GIT_CONFIG_*, GIT_EXTERNAL_DIFF,
# GIT_SSH_COMMAND, ...) is dropped unless the caller passes it in `env`.
_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")


class GitError(RuntimeError):
    """A git command failed; the message has git's stderr."""


def _base_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in _KEEP if k in os.environ}
    env["PATH"] = host_path.path()  # nothing git starts comes from a folder sandboxed commands can write
    env.update(
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        PAGER="cat",
        GIT_EDITOR="true",
        GIT_CONFIG_NOSYSTEM="1",  # /etc/gitconfig is the admin's; we need nothing from it
        GIT_OPTIONAL_LOCKS="0",
    )
    return env


def dangerous_keys(config_listing: str) -> list[str]:
    """Keys in a `git config --list -z` listing whose values git would run as programs."""
    keys = []
    for entry in config_listing.split("\0"):
        if not entry:
            continue
        key = entry.split("\n", 1)[0]
        leaf = key.rsplit(".", 1)[-1].lower()
        if leaf in _PROGRAM_LEAVES or key.lower().startswith(("filter.", "pager.")):
            keys.append(key)
    return keys


def _config_listing(repo: Path, env: dict[str, str], *scope: str) -> str:
    """`git config --list -z` (of `scope`: `--local`, ...) in `repo`; "" when git cannot say."""
    exe = host_path.which("git")
    if exe is None:
        return ""
    try:
        r = subprocess.run([exe, "-C", str(repo), "config", "--list", *scope, "-z"],
                           capture_output=True, text=True, env=env, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout if r.returncode == 0 else ""


def repository_programs(repo: Path) -> list[str]:
    """The keys of the repository's own git config (.git/config and what it includes) that name programs: a
    `git status` or `git diff` there runs them (core.fsmonitor, diff.external, a textconv or filter for files
    .gitattributes marks). The user's own and the system's config are theirs, and not looked at."""
    return dangerous_keys(_config_listing(repo, _base_env(), "--local", "--includes"))


def _overrides(repo: Path, env: dict[str, str]) -> dict[str, str]:
    """Every key that names a program, set to empty; the fixed safe values; filters not required."""
    pairs: dict[str, str] = {}
    for key in dangerous_keys(_config_listing(repo, env)):
        low = key.lower()
        if low.startswith("filter."):
            # an emptied filter that is `required` would make git refuse to add the file
            pairs[key] = "false" if low.endswith(".required") else ""
            pairs[re.sub(r"\.[^.]+$", ".required", key)] = "false"
        else:
            pairs[key] = "false" if low.startswith("pager.") else ""
    pairs.update(_FIXED)
    return pairs


def git(
    repo: Path,
    *args: str,
    check: bool = True,
    input: str | None = None,  # noqa: A002 - the subprocess name
    env: dict | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `git -C repo *args` with no repository-controlled programs. `env` adds variables (GIT_INDEX_FILE,
    identities). Raises GitError when `check` and git exits non-zero (or cannot start)."""
    full = _base_env()
    full.update({k: str(v) for k, v in (env or {}).items()})
    try:
        pairs = _overrides(Path(repo), full)
        for i, (k, v) in enumerate(pairs.items()):
            full[f"GIT_CONFIG_KEY_{i}"] = k
            full[f"GIT_CONFIG_VALUE_{i}"] = v
        full["GIT_CONFIG_COUNT"] = str(len(pairs))
        exe = host_path.which("git")
        if exe is None:
            raise OSError("git is not installed (or only in a folder that commands can write)")
        r = subprocess.run(
            [exe, "--no-pager", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            input=input,
            env=full,
            timeout=timeout,
            stdin=subprocess.DEVNULL if input is None else None,
        )
    except OSError as e:
        raise GitError(f"git could not start: {e}") from None
    if check and r.returncode != 0:
        raise GitError(f"git {' '.join(args[:2])} failed (exit {r.returncode}): {r.stderr.strip()[:300]}")
    return r


def toplevel(path: Path) -> Path | None:
    """The working tree root that holds `path`, or None outside a repository (or without git).

    Only a working tree whose own `.git` is the repository git found counts. `core.worktree` in a hostile
    .git/config (`= ../..`, `= /etc`) names another folder as the working tree: that folder (a parent of the
    repository, your home) would become the root the agent edits freely and the sandbox lets commands write. A
    linked worktree or a submodule (`.git` a file, `gitdir: ...`) counts when that file names the git dir."""
    try:
        r = git(path, "rev-parse", "--show-toplevel", "--absolute-git-dir", check=False, timeout=30)
    except (GitError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or len(lines) != 2:
        return None
    top, gitdir = Path(lines[0]), os.path.realpath(lines[1])
    real = Path(os.path.realpath(path))
    if not (real == Path(os.path.realpath(top)) or Path(os.path.realpath(top)) in real.parents):
        return None
    dotgit = top / ".git"
    if dotgit.is_file() and not dotgit.is_symlink():
        first = dotgit.read_text(errors="replace").partition("\n")[0]
        named = first.removeprefix("gitdir:").strip() if first.startswith("gitdir:") else ""
        return top if named and os.path.realpath(top / named) == gitdir else None
    return top if os.path.realpath(dotgit) == gitdir else None
