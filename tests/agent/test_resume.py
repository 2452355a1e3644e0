"""Sessions: --continue picks the latest, --resume ID continues that conversation with its checkpoints."""

from __future__ import annotations

import pytest

from agent.session import find_session, list_sessions, sessions_dir
from tests.agent.conftest import git
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


def test_resume_continues_conversation_and_checkpoints(repo, fake_model):
    fake_model.script = [reply(tools=[("bash", {"command": "echo one > one.txt"})]), reply("first done")]
    s1 = make_session(repo, fake_model)
    s1.agent.run("first task")
    s1.agent.finish("submitted")
    s1.close()

    fake_model.script = [reply("second task done")]
    s_other = make_session(repo, fake_model)  # a newer, unrelated session
    s_other.agent.run("other")
    s_other.close()

    fake_model.script = [reply(tools=[("bash", {"command": "echo two > two.txt"})]), reply("continued")]
    s2 = make_session(repo, fake_model, resume=s1.id)
    assert s2.id == s1.id and s2.resumed
    s2.agent.run("second task")
    sent = fake_model.requests[-2]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["first task", "second task"]
    assert s2.agent.stats.steps == 4
    s2.agent.rewind(2)  # the first session's turn can still be undone after resuming
    assert not (repo / "one.txt").exists() and not (repo / "two.txt").exists()
    s2.close()

    folder = sessions_dir(repo)
    assert find_session(folder, None) == s2.path  # latest by modification time
    assert len(list_sessions(folder)) == 2
    assert git(repo, "status", "--porcelain") == ""  # .glm5/ is ignored by its own .gitignore files
    with pytest.raises(FileNotFoundError, match="no session"):
        find_session(folder, "nope")


def test_continue_latest(repo, fake_model):
    fake_model.script = [reply("a")]
    s1 = make_session(repo, fake_model)
    s1.agent.run("remember 42")
    s1.close()
    fake_model.script = [reply("b")]
    s2 = make_session(repo, fake_model, continue_latest=True)
    s2.agent.run("what number?")
    s2.close()
    assert s2.id == s1.id
    assert "remember 42" in [m.get("content") for m in fake_model.requests[-1]["messages"]]


def test_a_shared_sessions_folder_continues_this_repository_only(repo, fake_model, tmp_path):
    shared = tmp_path / "all-sessions"
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    fake_model.script = [reply("in repo")]
    s1 = make_session(repo, fake_model, flags={"sessions_dir": str(shared)})
    s1.agent.run("repo task")
    s1.close()
    fake_model.script = [reply("in other")]
    s2 = make_session(other, fake_model, flags={"sessions_dir": str(shared)})
    s2.agent.run("other task")
    s2.close()
    s3 = make_session(repo, fake_model, flags={"sessions_dir": str(shared)}, continue_latest=True)
    s3.close()
    assert s3.id == s1.id


def test_a_foreign_session_resumed_by_name_goes_on_under_a_plain_id(repo, fake_model):
    # issue 40: a session file another party put in .glm5/sessions, named explicitly with --resume, may lack the
    # header's id (a KeyError before) or carry one that is a path; the id names the scratch folder, so neither is
    # taken as it is.
    import json

    folder = sessions_dir(repo)
    folder.mkdir(parents=True, exist_ok=True)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    for name, header in (("noid", {"type": "session"}), ("pathid", {"type": "session", "id": "../../escape"})):
        lines = [header, *({"type": "message", "message": m} for m in msgs)]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        fake_model.script = [reply("again")]
        s = make_session(repo, fake_model, resume=name)
        assert s.id == name and ".." not in str(s.agent.env.scratch_dir.relative_to(repo))
        s.close()
