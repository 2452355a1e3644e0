"""Host-side file operations inside folders a trial can write (/app, /logs, the scratch folder).

A command in the sandbox can replace any entry of those folders with a symbolic link to a host file, and the host
must never open, write or delete through it (a link to a `.pth` of the user's venv, written by the host, runs code
at the next `python`). Every path is walked from a directory descriptor of the expected folder, one component at a
time with O_NOFOLLOW: a link anywhere on the way is an error (OSError ELOOP / ENOTDIR), never followed. Files the
grader makes for itself (test.patch, prediction.diff) live in `private_dir()`, a folder no trial sees.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(rel: str | Path) -> list[str]:
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise OSError(errno.EINVAL, f"{rel}: not a relative path inside its folder")
    return parts


@contextmanager
def _parent_fd(root: Path, rel: str | Path, create: bool = False):
    """A descriptor of the folder holding `rel` under `root` (no link followed on the way), and the last name."""
    parts = _parts(rel)
    fd = os.open(root, DIR_FLAGS)
    try:
        for name in parts[:-1]:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd, parts[-1]
    finally:
        os.close(fd)


def write_beneath(root: Path, rel: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to root/rel as a new regular file: what a trial left at that name (a link, a file) is removed
    first, never written through; missing folders are made."""
    with _parent_fd(Path(root), rel, create=True) as (dfd, name):
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, f"{rel} is a folder")
            os.unlink(name, dir_fd=dfd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode & 0o777)
            f.write(data)


def read_beneath(root: Path, rel: str | Path, limit: int) -> bytes | None:
    """At most `limit` bytes of root/rel when it is a regular file reached without a link; else None."""
    try:
        with _parent_fd(Path(root), rel) as (dfd, name):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read(limit)


def unlink_beneath(root: Path, rel: str | Path) -> None:
    """Remove the entry root/rel itself (a link is removed, not what it names); nothing if it is absent or the way
    to it goes through a link."""
    try:
        with _parent_fd(Path(root), rel) as (dfd, name):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise


def private_dir(prefix: str = "glm5-grade-") -> Path:
    """A new folder only this user can enter, outside every trial's view (the sandbox's /tmp is its own tmpfs)."""
    return Path(tempfile.mkdtemp(prefix=prefix))
