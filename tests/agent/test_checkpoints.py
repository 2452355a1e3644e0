"""Checkpoints restore exact bytes (incl. shell-made changes) and never touch the user's index, HEAD or stash."""

from __future__ import annotations

import hashlib
import os
import time

from agent.checkpoints import Checkpoints
from agent.trajectory import Trajectory
from tests.agent.conftest import git
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


def tree_state(root):
    """Every non-ignored file (outside .git/.glm5) -> (bytes digest, mode)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".glm5", "__pycache__", ".pytest_cache")]
        for f in filenames:
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, root)
            if rel.endswith(".log"):
                continue
            with open(p, "rb") as fh:
                out[rel] = (hashlib.sha256(fh.read()).hexdigest(), os.stat(p).st_mode & 0o777)
    return out


def test_restore_exact_bytes_and_user_state_untouched(repo):
    # a user mid-work: a staged change, an unstaged one, an untracked file, a stash
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b  # staged\n")
    git(repo, "add", "calc.py")
    (repo / "notes.txt").write_bytes(b"crlf line\r\nbinary \x00\xff\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(repo / "run.sh", 0o755)
    (repo / "debug.log").write_text("ignored, never captured\n")
    git(repo, "stash", "list")
    before = tree_state(repo)
    index_before = (repo / ".git" / "index").read_bytes()
    head = git(repo, "rev-parse", "HEAD")
    status = git(repo, "status", "--porcelain")

    cp = Checkpoints(repo, "s1")
    first = cp.snapshot("start")
    assert first is not None and first.ref == "refs/glm5/checkpoints/s1/1"
    assert cp.snapshot("again") == first  # nothing changed: no new checkpoint

    # changes as a shell command would make them
    (repo / "test_calc.py").unlink()
    (repo / "notes.txt").write_text("rewritten\n")
    os.chmod(repo / "run.sh", 0o644)
    (repo / "pkg" / "sub").mkdir(parents=True)
    (repo / "pkg" / "sub" / "new.py").write_text("x = 1\n")
    second = cp.snapshot("after shell")
    assert second.commit != first.commit

    saved = cp.restore(first.commit)
    assert tree_state(repo) == before
    assert not (repo / "pkg").exists()
    assert (repo / "debug.log").exists()  # ignored files are left alone
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == status
    assert git(repo, "diff", "--cached") != ""  # the user's staged change is still staged

    cp.restore(saved.commit)  # a restore is undoable
    assert (repo / "pkg" / "sub" / "new.py").read_text() == "x = 1\n" and not (repo / "test_calc.py").exists()

    resumed = Checkpoints(repo, "s1")  # numbering continues for a resumed session
    assert resumed.n == cp.n and resumed.last.commit == cp.last.commit


def test_undo_and_rewind_restore_code_and_conversation(repo, fake_model):
    start = tree_state(repo)
    fake_model.script = [
        reply(tools=[("read", {"path": "calc.py"})]),
        reply(tools=[("edit", {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"})]),
        reply("turn 1 done"),
        # turn 2 changes things only through the shell
        reply(tools=[("bash", {"command": "echo made > shell_made.txt && rm test_calc.py && printf 'z' >> calc.py"})]),
        reply("turn 2 done"),
    ]
    s = make_session(repo, fake_model)
    a = s.agent
    a.run("fix add")
    after_turn1 = tree_state(repo)
    n_after_turn1 = len(a.messages)
    a.run("shell things")
    assert (repo / "shell_made.txt").exists()

    a.rewind(1)  # /undo
    assert tree_state(repo) == after_turn1 and len(a.messages) == n_after_turn1
    a.rewind(1)  # /rewind 1 again: before turn 1
    assert tree_state(repo) == start
    assert [m["role"] for m in a.messages] == ["system"]
    a.finish("submitted")
    s.close()

    t = Trajectory.load(s.path)
    assert [m["role"] for m in t.messages()] == ["system"]
    assert t.turns() == []
    rewinds = [r for r in t.records if r["type"] == "rewind"]
    assert len(rewinds) == 2 and rewinds[0]["saved_as"]
    assert t.outcome()["diff_kept"] is False and t.outcome()["undone_turns"] == 2


def test_rewind_n_turns_at_once(repo, fake_model):
    fake_model.script = []
    for i in range(3):
        fake_model.script += [reply(tools=[("bash", {"command": f"echo {i} > f{i}.txt"})]), reply(f"t{i}")]
    s = make_session(repo, fake_model)
    for i in range(3):
        s.agent.run(f"turn {i}")
    s.agent.rewind(2)
    assert (repo / "f0.txt").exists() and not (repo / "f1.txt").exists() and not (repo / "f2.txt").exists()
    assert sum(1 for m in s.agent.messages if m["role"] == "user") == 1
    s.close()


def test_same_size_edit_in_the_second_of_the_commit_is_captured(repo):
    # With whole-second timestamps git's stat cache cannot tell "x = 1" from "x = 2" written in the same second;
    # only its racy-clean check, which needs the real index mtime on the temporary index, looks at the content.
    (repo / "calc.py").write_text("x = 1\n")
    git(repo, "commit", "-qam", "one")
    cp = Checkpoints(repo, "racy")
    start = cp.snapshot("start")
    (repo / "calc.py").write_text("x = 2\n")
    time.sleep(1.1)  # the snapshot comes in a later second than the edit
    after = cp.snapshot("after")
    assert after.commit != start.commit
    assert git(repo, "show", f"{after.commit}:calc.py") == "x = 2\n"
