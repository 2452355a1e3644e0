"""Sessions: where trajectories live, new ids, `--continue` (the latest) and `--resume ID`.

A session is one trajectory file `<sessions dir>/<id>.jsonl` (default `<repo>/.glm5/sessions/`, kept out of git
by a `.gitignore` of `*` inside it) plus its hidden checkpoint refs and a scratch folder `.glm5/tmp/<id>/` for
long outputs and background job logs.
"""

from __future__ import annotations

import datetime
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agent
from agent import own_files
from agent.git_safe import git  # no repository-configured program runs on the host
from agent.provenance import is_ours
from agent.trajectory import SCHEMA, Trajectory, TrajectoryWriter


def _self_ignoring(path: Path) -> Path:
    own_files.create(path / ".gitignore", "*\n")
    return path


def sessions_dir(root: Path, configured: str | None = None) -> Path:
    """Where the session files go: the user's `sessions.dir`, or `<root>/.glm5/sessions` (a link the repository
    ships there, or at `.glm5`, is refused: own_files)."""
    if configured:
        path = Path(configured).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return _self_ignoring(path)
    return _self_ignoring(own_files.folder(root, ".glm5", "sessions"))


def scratch_dir(root: Path, session_id: str) -> Path:
    return _self_ignoring(own_files.folder(root, ".glm5", "tmp")) / session_id


def new_id() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def git_info(root: Path) -> dict[str, Any]:
    def q(*args: str) -> str | None:
        r = git(root, *args, check=False, timeout=30)
        return r.stdout.strip() if r.returncode == 0 else None

    return {"head": q("rev-parse", "HEAD"), "branch": q("rev-parse", "--abbrev-ref", "HEAD")}


@dataclass
class SessionInfo:
    id: str
    path: Path
    created: float
    title: str
    n_records: int
    ours: bool = True  # recorded by glm5 on this machine (agent/provenance.py)


def list_sessions(folder: Path, root: Path | None = None) -> list[SessionInfo]:
    """Sessions newest first (by file modification time); only those of repository `root` when given, since a
    user-wide sessions folder holds many repositories' sessions."""
    out = []
    for p in sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            t = Trajectory.load(p)
        except (ValueError, OSError):
            continue
        if root is not None and t.header.get("root") not in (None, str(root)):
            continue
        first_user = next(
            (
                r["message"].get("content")
                for r in t.records
                if r.get("type") == "message" and r["message"].get("role") == "user"
            ),
            "",
        )
        out.append(SessionInfo(p.stem, p, t.header.get("ts", 0), str(first_user or "")[:80], len(t.records),
                               is_ours(t.records)))  # fmt: skip
    return out


def find_session(folder: Path, session_id: str | None, root: Path | None = None) -> Path:
    """The trajectory for `session_id` (a unique prefix is enough), or the latest (of `root`) when None."""
    sessions = list_sessions(folder, root if session_id is None else None)
    if not sessions:
        raise FileNotFoundError(f"no sessions in {folder}")
    if session_id is None:  # the latest: only one this machine recorded (a repository can commit sessions)
        ours = [s for s in sessions if s.ours]
        if not ours:
            raise FileNotFoundError(f"no session recorded on this machine in {folder} (the ones there came from "
                                    "elsewhere: name one with --resume ID to continue it anyway)")  # fmt: skip
        return ours[0].path
    hits = [s for s in sessions if s.id == session_id] or [s for s in sessions if s.id.startswith(session_id)]
    known = ", ".join(s.id for s in sessions[:5])
    if not hits:
        raise FileNotFoundError(f"no session {session_id!r} in {folder}; recent: {known}")
    if len(hits) > 1:
        raise FileNotFoundError(f"{session_id!r} matches {len(hits)} sessions; recent: {known}")
    return hits[0].path


def open_writer(path: Path, header: dict[str, Any] | None) -> TrajectoryWriter:
    """Open a trajectory for appending; a new one gets its `session` header first."""
    new = not path.exists() or path.stat().st_size == 0
    w = TrajectoryWriter(path)
    if new:
        if header is None:
            raise ValueError("a new trajectory needs a header")
        w.write("session", schema=SCHEMA, glm5_version=getattr(agent, "__version__", "0.1.0"), **header)
    return w
