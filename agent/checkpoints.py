"""Checkpoints: snapshots of the working tree in hidden git refs, and exact restores from them.

A snapshot is a commit whose tree is the working tree as it is on disk (tracked and untracked files, minus what
git ignores and minus `.glm5/`), made with a *temporary* index file (GIT_INDEX_FILE) seeded from a copy of the
user's index, so the user's index, branch, HEAD, stash and history are never touched. Snapshots chain as
parents and live under `refs/glm5/checkpoints/<session>/<n>`, which keeps them from garbage collection.
Because the tree is read from disk, changes made by shell commands are captured like edits.

Restore writes the target tree's files back byte for byte (modes and symlinks included) and deletes files that
exist now but not in the target; first it snapshots the present state, so a restore is itself undoable.
Git-ignored files are neither captured nor deleted.

Every git call goes through agent/git_safe.py: a snapshot runs `git add -A` on the host after commands the model
wrote, so it must not run a filter, hook or fsmonitor those commands could have configured.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.git_safe import GitError, git, toplevel

_IDENTITY = {
    "GIT_AUTHOR_NAME": "glm5",
    "GIT_AUTHOR_EMAIL": "glm5@localhost",
    "GIT_COMMITTER_NAME": "glm5",
    "GIT_COMMITTER_EMAIL": "glm5@localhost",
}
EXCLUDE = ":(exclude,top).glm5"


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class Checkpoint:
    ref: str
    commit: str


def git_root(path: Path) -> Path | None:
    return toplevel(path)


class Checkpoints:
    def __init__(self, root: Path, session_id: str):
        self.root = Path(root).resolve()
        self.prefix = f"refs/glm5/checkpoints/{session_id}"
        self.enabled = git_root(self.root) is not None
        self.git_dir = Path(self._git("rev-parse", "--absolute-git-dir").strip()) if self.enabled else None
        self.n = 0
        self.last: Checkpoint | None = None
        if self.enabled:  # a resumed session continues its numbering
            out = self._git("for-each-ref", "--format=%(refname) %(objectname)", self.prefix)
            for line in out.splitlines():
                ref, commit = line.split()
                k = int(ref.rsplit("/", 1)[1])
                if k > self.n:
                    self.n, self.last = k, Checkpoint(ref, commit)

    def _git(self, *args: str, index: str | None = None, check: bool = True) -> str:
        env = dict(_IDENTITY)
        if index is not None:
            env["GIT_INDEX_FILE"] = index
        try:
            r = git(self.root, *args, check=False, env=env, timeout=120)
        except (GitError, subprocess.TimeoutExpired) as e:
            raise CheckpointError(f"git {' '.join(args[:2])} failed: {e}") from None
        if check and r.returncode != 0:
            raise CheckpointError(f"git {' '.join(args[:2])} failed: {r.stderr.strip()[:300]}")
        return r.stdout

    def _temp_index(self) -> str:
        fd, path = tempfile.mkstemp(prefix="glm5-index-")
        os.close(fd)
        os.unlink(path)
        real = self.git_dir / "index" if self.git_dir else None
        if real is not None and real.exists():
            # A copy: git's stat cache makes `add -A` fast and the original is untouched. copy2 keeps the index's
            # mtime, which git's racy-clean check needs: with a fresh mtime, a same-size edit made in the same
            # second as the entry's stat would look unchanged and be missed.
            shutil.copy2(real, path)
        return path

    def snapshot(self, label: str) -> Checkpoint | None:
        """Snapshot the working tree. Returns the last checkpoint unchanged when nothing changed since it."""
        if not self.enabled:
            return None
        index = self._temp_index()
        try:
            self._git("add", "-A", "--", ":/", EXCLUDE, index=index)
            tree = self._git("write-tree", index=index).strip()
        finally:
            for p in (index, index + ".lock"):
                if os.path.exists(p):
                    os.unlink(p)
        if self.last is not None and self._git("rev-parse", f"{self.last.commit}^{{tree}}").strip() == tree:
            return self.last
        parents = ["-p", self.last.commit] if self.last else []
        commit = self._git("commit-tree", tree, *parents, "-m", f"glm5 checkpoint: {label}").strip()
        self.n += 1
        ref = f"{self.prefix}/{self.n}"
        self._git("update-ref", ref, commit)
        self.last = Checkpoint(ref, commit)
        return self.last

    def files(self, commit: str) -> set[str]:
        out = self._git("ls-tree", "-r", "-z", "--name-only", commit)
        return {p for p in out.split("\0") if p}

    def changed_files(self, a: str, b: str) -> list[str]:
        out = self._git("diff", "--name-only", "-z", "--no-renames", a, b)
        return [p for p in out.split("\0") if p]

    def restore(self, commit: str) -> Checkpoint | None:
        """Make the working tree equal to `commit`'s snapshot. Returns the snapshot taken just before."""
        if not self.enabled:
            raise CheckpointError("checkpoints need a git repository")
        before = self.snapshot("before restore")
        now = self.files(before.commit) if before else set()
        target = self.files(commit)
        for rel in sorted(now - target, reverse=True):
            p = self.root / rel
            if p.is_symlink() or p.is_file():
                p.unlink()
            parent = p.parent
            while parent != self.root and parent.exists() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        index = self._temp_index()
        try:
            self._git("read-tree", commit, index=index)
            self._git("checkout-index", "-a", "-f", index=index)
        finally:
            if os.path.exists(index):
                os.unlink(index)
        self.snapshot("restored")  # the chain continues from the restored state
        return before
