"""The files glm5 writes inside a repository (`.glm5/`: sessions, scratch folders, saved rules), never through a
symbolic link the repository ships.

A repository is someone else's input, and the host process writes these files outside the sandbox. A committed
`.glm5/settings.local.tmp -> ~/.config/glm5/config.toml` made saving an "always" rule write the repository's
settings into the user's own config (its hooks, `sandbox enabled = false`); `.glm5/sessions -> /elsewhere` put the
trajectories and the session's scratch folder, which the file tools may write, outside the repository. So each
folder on the way is made here one at a time and refused when it is a link, a new file is created only where
nothing is (`O_EXCL | O_NOFOLLOW`), and a rewrite goes through a fresh temporary file that replaces the old one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class LinkedPath(ValueError):
    """A path glm5 writes its own files to is a symbolic link (or not a folder); the message says what to do."""


def _refuse(path: Path) -> LinkedPath:
    what = f"a symbolic link (to {os.readlink(path)})" if path.is_symlink() else "not a folder"
    return LinkedPath(f"{path} is {what}: glm5 keeps its own files there and does not follow a link a repository "
                      f"ships. Remove it (glm5 makes its own), or set sessions.dir in your user settings")  # fmt: skip


def folder(root: Path, *parts: str) -> Path:
    """root/parts..., each made when missing; a part that is a link or a file is refused (LinkedPath)."""
    path = Path(root)
    for part in parts:
        path = path / part
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise _refuse(path)
        path.mkdir(exist_ok=True)
    return path


def create(path: Path, text: str) -> bool:
    """Write `text` to `path` when nothing is there (False when a file already is); a link there is refused."""
    if path.is_symlink():
        raise _refuse(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return True


def replace(path: Path, text: str) -> None:
    """Write `text` to `path` at once: a new temporary file in its folder renamed over it, so a link at `path` is
    replaced, not written through (the caller refuses one it must not replace: `check_not_link`)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_not_link(path: Path) -> None:
    if path.is_symlink():
        raise _refuse(path)
