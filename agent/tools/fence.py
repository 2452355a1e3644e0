"""File access for the file tools that holds at the moment of the read or write, not only at the permission check.

Permissions check a path's real location before a call, but a command running in the background can swap a
file for a symlink in between (`ln -sf ~/.bashrc notes.txt`), and the tool would then write through it, on the
host. So the tools open files here: the parent folder's real path must be allowed, the file itself is opened
with O_NOFOLLOW relative to that folder, and the opened descriptor's real path is checked again (through
/proc/self/fd) before a byte is read or written. Writes never land in `.git/` or `.glm5/`, whatever the path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent.tools.base import ToolError

PROTECTED = (".git", ".glm5")


def _check_real(real: Path, env: Any, writing: bool, shown: str) -> None:
    if not env.is_allowed(real):
        raise ToolError(f"{shown} resolves to {real}, outside the repository")
    if writing:
        root = Path(os.path.realpath(env.root))
        for p in PROTECTED:
            base = root / p
            if real == base or base in real.parents:
                raise ToolError(f"{shown} resolves into {p}/: the agent does not edit git's data or its own settings")


def _fd_path(fd: int) -> Path:
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return Path("/")  # no /proc: refuse rather than guess


def _open(env: Any, path: Path, flags: int, writing: bool, depth: int = 0) -> int:
    shown = env.display(path)
    parent = Path(os.path.realpath(path.parent))
    _check_real(parent, env, writing, shown)
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fd = os.open(path.name, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=dfd)
        except OSError as e:
            if e.errno != 40 or depth > 0:  # 40 ELOOP: the file is a symlink
                raise
            target = Path(os.path.realpath(path))
            _check_real(target, env, writing, shown)
            fd = None
    finally:
        os.close(dfd)
    if fd is None:  # a link inside the repository: open its target, which is checked the same way
        return _open(env, target, flags, writing, depth + 1)
    try:
        _check_real(_fd_path(fd), env, writing, shown)
    except ToolError:
        os.close(fd)
        raise
    return fd


def read_bytes(env: Any, path: Path) -> bytes:
    fd = _open(env, path, os.O_RDONLY, writing=False)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_bytes(env: Any, path: Path, data: bytes) -> None:
    """Create or truncate `path` and write `data`; missing parent folders are made inside the repository only."""
    missing = []
    p = path.parent
    while not p.exists() and not p.is_symlink():
        missing.append(p)
        p = p.parent
    _check_real(Path(os.path.realpath(p)), env, True, env.display(path))
    for d in reversed(missing):
        d.mkdir()
    fd = _open(env, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, writing=True)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
