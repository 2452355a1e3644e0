"""The repositories tasks name, and a fresh clone of one per trial; the user's repositories are never touched.

A task's `repo` is a local path (relative to the tasks file), a git URL, or `owner/name`, looked up under
`--repos DIR` as DIR/owner/name, DIR/owner__name or DIR/name (offline CI) before github.com. Each source is
mirrored once into the run's cache (`git clone --bare`: reads the source, writes nothing there); each base commit
is taken once from the mirror into a bare snapshot of that commit's history alone (`snapshot`); a trial gets a
copy of the snapshot checked out at base_commit: no ref but HEAD, no remote, no borrowing from the cache (hidden
from trials), so git works inside it and the upstream fix is not in it.

Every git call is host-side git through agent/git_safe.py: a repository (or an agent that wrote into one)
cannot make it run a hook, filter or fsmonitor. GitPython is not used: it runs git with the repository's own
configuration, which is what git_safe exists to prevent.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from agent.bench.environments import InfraError
from agent.git_safe import GitError, git

URL = re.compile(r"^([a-z][a-z0-9+.-]*://|git@|file:)", re.I)
OWNER_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
# What the agent's tools leave in the tree that is not part of its answer.
DIFF_EXCLUDES = (":(exclude).glm5", ":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc")


class RepoCache:
    def __init__(self, cache_dir: Path, repos_dir: Path | None = None, base_dir: Path | None = None):
        self.dir = Path(cache_dir).resolve() / "repos"  # git runs with -C: a relative path would be read twice
        self.repos_dir = Path(repos_dir).resolve() if repos_dir else None
        self.base_dir = Path(base_dir).resolve() if base_dir else Path.cwd()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def source(self, repo: str) -> str:
        """Where to clone `repo` from: a local folder, or a URL."""
        if URL.match(repo):
            return repo
        p = Path(repo).expanduser()
        p = p if p.is_absolute() else self.base_dir / p
        if p.exists():
            return str(p.resolve())
        if OWNER_NAME.match(repo):
            owner, name = repo.split("/")
            if self.repos_dir is not None:
                for c in (self.repos_dir / owner / name, self.repos_dir / f"{owner}__{name}", self.repos_dir / name):
                    if c.exists():
                        return str(c)
            return f"https://github.com/{repo}.git"
        raise InfraError(f"repository {repo!r} is neither a folder, a URL nor owner/name")

    def mirror(self, repo: str) -> Path:
        """The bare mirror of `repo` in the cache, made on first use (one thread makes it; others wait)."""
        src = self.source(repo)
        key = re.sub(r"[^A-Za-z0-9_.-]", "_", repo.rstrip("/").split("/")[-1])[:40]
        dest = self.dir / f"{key}-{hashlib.sha256(src.encode()).hexdigest()[:10]}.git"
        hint = "" if self.repos_dir or not OWNER_NAME.match(repo) else " (offline? map it with --repos DIR)"
        return self._once(dest, lambda tmp: git(self.dir, "clone", "--bare", "--quiet", src, str(tmp), timeout=1800),
                          f"could not clone {src}{hint}")  # fmt: skip

    def snapshot(self, repo: str, commit: str) -> Path:
        """A bare repository in the cache holding `commit` and its history and nothing else (no later commit, no
        other ref, no reflog), taken from the mirror once per commit: the trials of a task (a bench's attempts, an
        RL group's samples) copy it instead of each repacking the history they need."""
        mirror = self.mirror(repo)
        try:
            # a bare repository is named explicitly (git_safe sets safe.bareRepository=explicit)
            full = git(mirror, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", env={"GIT_DIR": str(mirror)},
                       timeout=60).stdout.strip()  # fmt: skip
        except GitError:
            raise InfraError(f"{repo} has no commit {commit!r}") from None
        dest = self.dir / "at" / f"{mirror.stem}-{full}.git"

        def take(tmp: Path) -> None:
            git(dest.parent, "init", "--bare", "--quiet", str(tmp), timeout=60)
            git(tmp, "fetch", "--quiet", "--no-tags", str(mirror), f"{full}:refs/heads/base",
                env={"GIT_DIR": str(tmp)}, timeout=3600)  # fmt: skip

        return self._once(dest, take, f"could not take {commit} of {repo} from its mirror")

    def _once(self, dest: Path, make, failed: str) -> Path:
        """`dest` (a bare repository), made by `make(tmp)` on first use by one thread while others wait, in a
        `.partial` folder renamed whole: a half-made one is never taken for a whole one."""
        with self._guard:
            lock = self._locks.setdefault(str(dest), threading.Lock())
        with lock:
            if (dest / "HEAD").exists():
                return dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                make(tmp)
            except (GitError, subprocess.TimeoutExpired) as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise InfraError(f"{failed}: {e}") from None
            tmp.rename(dest)
        return dest

    def checkout(self, repo: str, commit: str, dest: Path) -> None:
        """A fresh clone of `repo` at `commit` in `dest` (which must not exist or be empty), its own: a copy of
        `snapshot`'s objects (no alternates into the cache, which trials cannot see), no ref and no remote, so
        git works inside the trial and `git log --all` there shows the base commit's history and no more."""
        snap = self.snapshot(repo, commit)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            git(dest.parent, "clone", "--no-hardlinks", "--no-checkout", "--quiet", str(snap), str(dest), timeout=600)
            git(dest, "checkout", "--quiet", "--detach", "refs/remotes/origin/base", timeout=600)
            for ref in git(dest, "for-each-ref", "--format=%(refname)", timeout=120).stdout.split():
                git(dest, "update-ref", "--no-deref", "-d", ref, timeout=60)
            git(dest, "remote", "remove", "origin", timeout=60)  # a path into the hidden cache, of no use inside
            git(dest, "reflog", "expire", "--expire=now", "--all", timeout=120)
        except GitError as e:
            raise InfraError(f"could not check out {commit} of {repo}: {e}") from None
        except subprocess.TimeoutExpired:
            raise InfraError(f"checking out {commit} of {repo} timed out") from None


def working_tree_diff(app: Path, base_commit: str, agents_git: bool = False) -> str:
    """The prediction: everything in `app` that differs from base_commit, new files included (binary-safe).

    Staged through a throwaway index, in a host folder no command can reach (one in the trial's scratch folder
    could be locked from inside, making the diff fail), so the trial's own index is left alone.
    `agents_git`: app/.git is the agent's (a terminal task's, writable inside). Host git then reads only a plain
    .git folder, named explicitly (GIT_DIR, GIT_WORK_TREE: a `core.worktree` it set would diff a host folder the
    sandbox hides), with no alternates (objects from another repository); else no diff ("").
    """
    app = Path(app)
    env: dict[str, str] = {}
    if agents_git:
        dotgit = app / ".git"
        if dotgit.is_symlink() or not dotgit.is_dir() or (dotgit / "commondir").exists():
            return ""  # a `gitdir:` file or a link: another repository, maybe the host's
        if (dotgit / "objects" / "info" / "alternates").exists():
            return ""
        env = {"GIT_DIR": str(dotgit), "GIT_WORK_TREE": str(app)}
    tmp = tempfile.mkdtemp(prefix="glm5-diff-")
    index = Path(tmp) / "index"
    env["GIT_INDEX_FILE"] = str(index)
    try:
        git(app, "read-tree", base_commit, env=env, timeout=120)
        git(app, "add", "-A", "--", ".", *DIFF_EXCLUDES, env=env, timeout=300)
        r = git(app, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", base_commit, env=env, timeout=300)
    except GitError as e:
        raise InfraError(f"could not read the trial's changes: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return r.stdout
