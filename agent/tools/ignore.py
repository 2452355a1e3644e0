"""Which files the search tools skip: VCS folders, glm5's own folder, and what git ignores."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agent.git_safe import GitError, git

SKIP_DIRS = {".git", ".hg", ".svn", ".glm5"}


def git_ignored(root: Path, paths: list[Path]) -> set[Path]:
    """The subset of `paths` that git ignores (empty outside a git repository or without git)."""
    if not paths:
        return set()
    try:
        r = git(
            root,
            "check-ignore",
            "--stdin",
            "-z",
            input="\0".join(str(p) for p in paths) + "\0",
            check=False,
            timeout=30,
        )
    except (GitError, subprocess.TimeoutExpired):
        return set()
    if r.returncode not in (0, 1):  # 128: not a git repository
        return set()
    return {Path(p) for p in r.stdout.split("\0") if p}


def _stays_inside(p: Path, base: Path, root: Path) -> bool:
    """A file whose real path (links followed) is under the search folder or the repository."""
    real = Path(os.path.realpath(p))
    return any(real.is_relative_to(os.path.realpath(b)) for b in (base, root))


def walk_files(base: Path, root: Path) -> list[Path]:
    """Files under `base`, skipping SKIP_DIRS and git-ignored paths."""
    if base.is_file():
        return [base]
    files = []
    for p in base.rglob("*"):
        rel_parts = p.relative_to(base).parts
        if any(part in SKIP_DIRS for part in rel_parts):
            continue
        if p.is_file() and _stays_inside(p, base, root):
            files.append(p)
    ignored = git_ignored(root, files)
    return [f for f in files if f not in ignored]
