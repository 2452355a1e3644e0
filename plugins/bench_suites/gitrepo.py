"""Deterministic git repositories: the same files, messages and dates give the same commit SHAs on every machine.

Plain `git` subprocesses with nothing of the user's set-up: no global or system config (GIT_CONFIG_GLOBAL=/dev/null,
GIT_CONFIG_NOSYSTEM=1), no hooks, no templates, fixed author and committer, fixed dates, files written with fixed
modes. Diffs between two file sets are made in a throwaway repository, so the repository a task ships never holds
the objects of its gold patch or its tests (an agent could otherwise find them with `git fsck --lost-found`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

AUTHOR = ("glm5 builtin suite", "builtin@glm5.invalid")
# -c options that pin everything a user's config or git's defaults could vary between machines.
GIT_OPTIONS = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.autocrlf=false",
    "-c", "core.fileMode=true",
    "-c", "commit.gpgSign=false",
    "-c", "init.defaultBranch=main",
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.renames=false",
    "-c", "diff.algorithm=myers",
)  # fmt: skip

Files = dict[str, str]


class GitError(RuntimeError):
    pass


def git_env(date: str | None = None) -> dict[str, str]:
    """The environment of every git call: no user config, fixed identity, and `date` (ISO 8601) for commits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME=AUTHOR[0],
        GIT_AUTHOR_EMAIL=AUTHOR[1],
        GIT_COMMITTER_NAME=AUTHOR[0],
        GIT_COMMITTER_EMAIL=AUTHOR[1],
        LC_ALL="C",
        TZ="UTC",
    )
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    return env


def git(repo: Path, *args: str, date: str | None = None, check: bool = True) -> str:
    p = subprocess.run(
        ["git", *GIT_OPTIONS, "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env=git_env(date),
        stdin=subprocess.DEVNULL,
    )
    if check and p.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {repo}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def init(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    # --template= keeps the sample hooks and the description file out: nothing machine-dependent in .git.
    git(repo, "init", "--quiet", "--template=", "--initial-branch=main")


def write_files(root: Path, files: Files, executable: tuple[str, ...] = ()) -> None:
    """Write `files` (path -> text) under root with modes git records the same everywhere (0644, or 0755)."""
    for rel, text in files.items():
        path = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ValueError(f"file path {rel!r} leaves the repository")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        path.chmod(0o755 if rel in executable or rel.endswith(".sh") else 0o644)


def commit(repo: Path, message: str, date: str) -> str:
    """Stage everything in the work tree and commit it at `date`; returns the new commit's SHA."""
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--allow-empty", "--no-verify", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD").strip()


def diff(before: Files, after: Files) -> str:
    """The `git diff` that turns the file set `before` into `after`, as `git apply` and `patch -p1` read it."""
    with tempfile.TemporaryDirectory(prefix="glm5-suite-diff-") as tmp:
        scratch = Path(tmp)
        init(scratch)
        write_files(scratch, before)
        commit(scratch, "before", "2000-01-01T00:00:00+00:00")
        for rel in set(before) - set(after):
            (scratch / rel).unlink()
        write_files(scratch, {k: v for k, v in after.items() if before.get(k) != v})
        git(scratch, "add", "--all")
        out = git(scratch, "diff", "--cached", "--no-color", "--no-ext-diff", "--full-index")
    if not out:
        raise ValueError("the two file sets are identical: an empty diff")
    return out


def remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
