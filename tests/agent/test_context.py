"""Instruction files in the system prompt; compaction (auto, manual, on a context-length error) re-reads them."""

from __future__ import annotations

from agent.context import instruction_files, system_prompt
from agent.trajectory import Trajectory
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


def test_instruction_files_root_to_cwd(repo, isolated_config):
    (isolated_config / "AGENTS.md").write_text("global rule")
    (repo / "AGENTS.md").write_text("root rule")
    (repo / "CLAUDE.md").write_text("ignored: AGENTS.md wins in the same folder")
    sub = repo / "pkg" / "mod"
    sub.mkdir(parents=True)
    (repo / "pkg" / "CLAUDE.md").write_text("pkg rule (CLAUDE.md fallback)")
    (sub / "AGENTS.md").write_text("mod rule")
    files = instruction_files(repo, sub)
    assert [f.read_text() for f in files] == ["global rule", "root rule", "pkg rule (CLAUDE.md fallback)", "mod rule"]
    prompt = system_prompt(repo, sub)
    assert prompt.index("root rule") < prompt.index("mod rule") and "ignored:" not in prompt


def _settings(repo, window):
    (repo / ".glm5").mkdir(exist_ok=True)
    (repo / ".glm5" / "settings.toml").write_text(f"[providers.local]\ncontext_window = {window}\n")


def test_auto_compaction_puts_instructions_back(repo, fake_model):
    _settings(repo, 1000)
    (repo / "AGENTS.md").write_text("Always run pytest. v1")
    fake_model.script = [
        {**reply(tools=[("read", {"path": "calc.py"})]), "prompt_tokens": 900},  # 92% of the window
        reply("Summary: read calc.py, add subtracts; next fix it."),  # the compaction call
        reply("Fixed."),
    ]
    s = make_session(repo, fake_model)
    (repo / "AGENTS.md").write_text("Always run pytest. v2")  # changed on disk: compaction must re-read it
    res = s.agent.run("fix add")
    s.close()
    assert res.final == "Fixed."
    summary_req = fake_model.requests[1]
    assert "tools" not in summary_req and "Summarize the conversation" in summary_req["messages"][-1]["content"]
    after = fake_model.requests[2]["messages"]
    assert "Always run pytest. v2" in after[0]["content"]
    assert "Summary: read calc.py" in after[1]["content"]
    assert after[-1]["content"].endswith("fix add")  # the request is repeated after an automatic compaction
    t = Trajectory.load(s.path)
    assert [r["type"] for r in t.records].count("compaction") == 1
    assert t.messages()[: len(after)] == after


def test_manual_compact_with_focus_and_pre_compact_hook(repo, fake_model):
    fake_model.script = [reply("hello"), reply("summary text")]
    s = make_session(repo, fake_model)
    s.agent.run("hi")
    assert s.agent.compact(focus="the API design")
    assert "the API design" in fake_model.requests[-1]["messages"][-1]["content"]
    assert [m["role"] for m in s.agent.messages] == ["system", "user", "assistant"]
    s.close()

    (repo / ".glm5").mkdir(exist_ok=True)
    (repo / ".glm5" / "settings.toml").write_text('[hooks]\nPreCompact = [{ command = "echo keep it >&2; exit 2" }]\n')
    fake_model.script = [reply("hello")]
    s = make_session(repo, fake_model)
    s.agent.run("hi")
    n = len(fake_model.requests)
    assert s.agent.compact() is False and len(fake_model.requests) == n
    s.close()


def test_context_length_error_compacts_and_retries(repo, fake_model):
    fake_model.script = [
        {"status": 400, "message": "maximum context length exceeded"},
        reply("summary"),
        reply("answer after compaction"),
    ]
    s = make_session(repo, fake_model)
    res = s.agent.run("big question")
    s.close()
    assert res.final == "answer after compaction"


def test_compaction_of_a_conversation_too_long_to_summarize(repo, fake_model):
    fake_model.script = [reply("a1"), reply("a2"), reply("a3"), {"status": 400, "message": "context length exceeded"},
                         reply("summary of the newer half")]  # fmt: skip
    s = make_session(repo, fake_model)
    for q in ("q1", "q2", "q3"):
        s.agent.run(q)
    assert s.agent.compact()
    s.close()
    first, second = fake_model.requests[3]["messages"], fake_model.requests[4]["messages"]
    assert "q1" in [m.get("content") for m in first] and "q1" not in [m.get("content") for m in second]
    assert second[0]["role"] == "system" and second[1]["role"] == "user"
    assert "summary of the newer half" in s.agent.messages[1]["content"]


def test_an_instruction_file_swapped_for_a_link_after_the_check_is_not_read(repo, isolated_config, monkeypatch):
    # issue 40, item 7: instruction_files checked AGENTS.md, then read_bytes opened it again by name; a command
    # swapping it for a link in between sent the link's target (a credential) to the model
    import agent.context as context

    secret = repo.parent / "secret.txt"
    secret.write_text("AWS_SECRET=xyz")
    (repo / "AGENTS.md").write_text("root rule")
    checked = context.instruction_files(repo, repo)
    (repo / "AGENTS.md").unlink()
    (repo / "AGENTS.md").symlink_to(secret)  # the swap, after the check
    monkeypatch.setattr(context, "instruction_files", lambda root, cwd: checked)
    assert "AWS_SECRET" not in context.instructions_text(repo, repo)
    (repo / "AGENTS.md").unlink()
    (repo / "AGENTS.md").write_text("root rule")
    assert "root rule" in context.instructions_text(repo, repo)
