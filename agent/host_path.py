"""The programs glm5 itself runs on the host (git for checkpoints, bwrap, rg for `grep`, bash for hooks), found on
a PATH without the folders that sandboxed commands can write.

A user who starts glm5 with the repository's virtual environment active has `<repo>/.venv/bin` on PATH, and the
repository is writable inside the sandbox. One approved command (`pip install -e .` writes there; so may a model's
`printf ... > .venv/bin/git`) would plant a `git` that the next checkpoint runs on the host, outside the sandbox
(or a `bwrap` that runs the next command with no sandbox at all). So each session's writable folders are guarded
here (`guard`, by the Environment that runs its commands), and `which` and `path` leave out every PATH entry inside
one, and every relative entry (`.`, empty), which names whatever folder a program happens to start in.

Trials run concurrently (`glm5 bench -n N`, RL's orchestrator), each registering and releasing its folders while
others look programs up. So the guarded set is never mutated in place: a registration replaces it, under a lock,
with a new frozen set (copy on write), and a lookup reads whichever set is current, whole. A registration is
counted per folder and ends with its `Guard` (the Environment's `close`), so a long run's set holds the folders
of the trials running now, not of every trial the process ever ran; and a lookup tests each PATH entry's
ancestors for membership, so its cost is the depth of the entry, not the number of guarded folders.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter
from pathlib import Path

_lock = threading.Lock()
_counts: Counter[Path] = Counter()  # folder -> live registrations; changed only under _lock
_guarded: frozenset[Path] = frozenset()  # the current set, replaced whole under _lock, read without it


class Guard:
    """One registration of folders; `release()` (idempotent) ends it. A folder stays guarded while any
    registration of it is live."""

    def __init__(self, folders: tuple[Path, ...]):
        self.folders = folders
        self._live = True

    def release(self) -> None:
        global _guarded
        with _lock:
            if not self._live:
                return
            self._live = False
            _counts.subtract(self.folders)
            for f in self.folders:
                if _counts[f] <= 0:
                    del _counts[f]
            _guarded = frozenset(_counts)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def guard(*folders: str | Path) -> Guard:
    """Folders that sandboxed commands may write: host programs are never taken from inside them until the returned
    `Guard` is released."""
    global _guarded
    real = tuple(Path(os.path.realpath(f)) for f in folders)
    with _lock:
        _counts.update(real)
        _guarded = frozenset(_counts)
    return Guard(real)


def guarded() -> frozenset[Path]:
    """The folders guarded now (a snapshot)."""
    return _guarded


def _trusted(entry: str, guarded_now: frozenset[Path]) -> bool:
    if not entry or not os.path.isabs(entry):
        return False
    real = Path(os.path.realpath(entry))
    return real not in guarded_now and guarded_now.isdisjoint(real.parents)


def path(environ_path: str | None = None) -> str:
    """PATH (the host's, or `environ_path`) without the entries inside guarded folders, nor relative ones."""
    entries = (os.environ.get("PATH", os.defpath) if environ_path is None else environ_path).split(os.pathsep)
    guarded_now = _guarded  # one snapshot for the whole lookup
    return os.pathsep.join(e for e in entries if _trusted(e, guarded_now)) or os.defpath


def which(name: str) -> str | None:
    """The absolute path of the host program `name`, found on `path()`; None when there is none."""
    return shutil.which(name, path=path())
