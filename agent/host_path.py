"""The programs glm5 itself runs on the host (git for checkpoints, bwrap, rg for `grep`, bash for hooks), found on
a PATH without the folders that sandboxed commands can write.

A user who starts glm5 with the repository's virtual environment active has `<repo>/.venv/bin` on PATH, and the
repository is writable inside the sandbox. One approved command (`pip install -e .` writes there; so may a model's
`printf ... > .venv/bin/git`) would plant a `git` that the next checkpoint runs on the host, outside the sandbox
(or a `bwrap` that runs the next command with no sandbox at all). So each session's writable folders are guarded
here (`guard`, by the Environment that runs its commands), and `which` and `path` leave out every PATH entry inside
one, and every relative entry (`.`, empty), which names whatever folder a program happens to start in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_GUARDED: set[Path] = set()


def guard(*folders: str | Path) -> None:
    """Folders that sandboxed commands may write: host programs are never taken from inside them."""
    _GUARDED.update(Path(os.path.realpath(f)) for f in folders)


def _trusted(entry: str) -> bool:
    if not entry or not os.path.isabs(entry):
        return False
    real = Path(os.path.realpath(entry))
    return not any(real == g or g in real.parents for g in _GUARDED)


def path(environ_path: str | None = None) -> str:
    """PATH (the host's, or `environ_path`) without the entries inside guarded folders, nor relative ones."""
    entries = (os.environ.get("PATH", os.defpath) if environ_path is None else environ_path).split(os.pathsep)
    return os.pathsep.join(e for e in entries if _trusted(e)) or os.defpath


def which(name: str) -> str | None:
    """The absolute path of the host program `name`, found on `path()`; None when there is none."""
    return shutil.which(name, path=path())
