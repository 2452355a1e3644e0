"""The terminal tools in the agent loop (agent/tools/terminal.py): what a terminal would run is judged as the
same `bash` command, keystrokes to other programs run, the calls and screens are recorded as the model saw them,
compaction keeps a live screen, and each send is checkpointed like a command."""

from __future__ import annotations

import io
import json
import sys

import pytest

from agent.headless import HeadlessUI
from agent.tools.base import ToolContext, ToolError, ToolState
from agent.tools.terminal import TerminalSendTool, shell_lines
from agent.trajectory import Trajectory
from tests.agent.fake_model import reply
from tests.agent.helpers import RecordingUI, make_session


def _run(repo, fake_model, calls, flags=None, ui=None):
    fake_model.script = [reply(tools=[c]) for c in calls] + [reply("done")]
    ui = ui or RecordingUI()
    s = make_session(repo, fake_model, ui, flags=flags)
    try:
        s.agent.run("work in a terminal")
    finally:
        s.close()
    recs = [r for r in Trajectory.load(s.path).records if r["type"] == "tool"]
    return recs, ui, s


def test_a_shell_line_is_judged_as_the_same_bash_command(repo, fake_model):
    (repo / ".glm5").mkdir(exist_ok=True)
    (repo / ".glm5" / "settings.toml").write_text('[permissions]\ndeny = ["bash(rm:*)"]\n')
    recs, ui, _ = _run(repo, fake_model, [
        ("terminal_open", {"session": "main"}),
        ("terminal_send", {"session": "main", "input": ["rm -f calc.py", "<Enter>"]}),
        ("terminal_send", {"session": "main", "input": ["rm -f ", "calc.py"]}),  # typed, not run: allowed
        ("terminal_send", {"session": "main", "input": ["<Enter>"]}),  # ... and the Enter runs `rm -f calc.py`
        ("terminal_send", {"session": "main", "input": ["rm -f calc\t"]}),  # a tab completes: unknowable
        ("terminal_send", {"session": "main", "input": ["<C-u>", "touch made.txt\n"], "wait_for": r"^\$$"}),
    ])  # fmt: skip
    assert [r["decision"] for r in recs] == ["allow", "denied", "allow", "denied", "denied", "approved"]
    assert "denied by rule bash(rm:*)" in recs[1]["result"] and "denied by rule bash(rm:*)" in recs[3]["result"]
    assert "control character" in recs[4]["result"]
    assert (repo / "calc.py").exists() and (repo / "made.txt").exists()
    # the user was asked once, for the line that runs, shown in full, with a bash rule to "always allow"
    assert len(ui.requests) == 1 and ui.requests[0].tool == "terminal_send"
    assert "touch made.txt" in ui.requests[0].preview and ui.requests[0].suggested_rule.startswith("bash(touch")


def test_keystrokes_to_a_repl_run_and_a_job_in_cooked_mode_is_judged(repo, fake_model):
    (repo / ".glm5").mkdir(exist_ok=True)
    (repo / ".glm5" / "settings.toml").write_text('[permissions]\ndeny = ["bash(touch:*)"]\n')
    recs, ui, _ = _run(repo, fake_model, [
        ("terminal_open", {"session": "py", "command": f"{sys.executable} -q"}),
        ("terminal_send", {"session": "py", "input": ["print(6 * 7)\n"], "wait_for": r"^42\n>>> ?$"}),
        ("terminal_open", {"session": "sh"}),
        ("terminal_send", {"session": "sh", "input": ["sleep 5", "<Enter>"], "timeout": 0.5}),
        # typed ahead while `sleep` runs: the shell would run it once sleep ends
        ("terminal_send", {"session": "sh", "input": ["touch pwned\n"]}),
        ("terminal_open", {"session": "t", "command": "touch opened.txt"}),  # opening a program: its command line
    ], flags={"mode": "auto"})  # fmt: skip
    assert [r["decision"] for r in recs] == ["allow", "allow", "allow", "allow", "denied", "denied"]
    assert recs[1]["result"].splitlines()[-2:] == ["42", ">>>"]
    assert not (repo / "pwned").exists() and not (repo / "opened.txt").exists()


def test_the_foreground_changing_after_approval_sends_nothing(repo, tmp_path):
    from agent.environment import Environment

    env = Environment(repo, scratch_dir=tmp_path / "s")
    try:
        ctx, tool = ToolContext(env, ToolState()), TerminalSendTool()
        env.terminals.open("py", [sys.executable, "-q"])
        env.terminals.get("py").wait(pattern="^>>>", timeout_s=20)
        args = {"session": "py", "input": ["touch late.txt\n"]}
        assert tool.judge(args, env).subject is None  # keystrokes to python: nothing to judge
        env.terminals.get("py").send("import os; os.execvp('bash', ['bash', '--norc', '-i'])\r")
        env.terminals.get("py").wait(timeout_s=5)
        with pytest.raises(ToolError, match="foreground program changed"):
            tool.run(args, ctx)
        assert not (repo / "late.txt").exists()
    finally:
        env.close()


def test_shell_lines():
    assert shell_lines("", [("text", "ls"), ("key", "Enter")]) == (["ls"], "", None)
    assert shell_lines("rm ", [("text", "x"), ("key", "BSpace"), ("text", "y\necho")]) == (["rm y"], "echo", None)
    assert shell_lines("rm x", [("key", "C-c"), ("text", "ls\n")])[0] == ["ls"]
    assert "cannot be checked" in shell_lines("", [("key", "Up"), ("key", "Enter")])[2]


def test_calls_and_screens_are_recorded_streamed_and_checkpointed(repo, fake_model):
    out = io.StringIO()
    ui = HeadlessUI("stream-json", "auto", out=out, err=io.StringIO())
    recs, _, s = _run(repo, fake_model, [
        ("terminal_open", {"session": "main"}),
        ("terminal_send", {"session": "main", "input": ["echo hi > note.txt; echo written\n"], "wait_for": "^written"}),
    ], flags={"mode": "auto"}, ui=ui)  # fmt: skip
    traj = Trajectory.load(s.path)
    tool_msgs = [m for m in traj.messages() if m.get("role") == "tool"]
    assert [m["content"] for m in tool_msgs] == [r["result"] for r in recs]  # exactly what the model saw
    assert "written" in recs[1]["result"] and recs[1]["result"].startswith("[terminal main: 120x32")
    assert recs[1]["commit_before"] != recs[1]["commit_after"]  # the send is checkpointed: --undo restores
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    results = [e for e in events if e["type"] == "tool_result"]
    assert [e["content"] for e in results] == [r["result"] for r in recs]
    assert {t["function"]["name"] for t in traj.tools} >= {"terminal_open", "terminal_send", "terminal_read"}


def test_compaction_keeps_a_live_sessions_screen(repo, fake_model):
    fake_model.script = [reply(tools=[("terminal_open", {"session": "main"})]),
                         reply(tools=[("terminal_send", {"session": "main", "input": ["echo marker-$((6*7))\n"],
                                                         "wait_for": "^marker-42"})]),
                         reply("done"), reply("the summary")]  # fmt: skip
    s = make_session(repo, fake_model, flags={"mode": "auto"})
    try:
        s.agent.run("go")
        assert s.agent.compact()
        assert "marker-42" in s.agent.messages[1]["content"] and "[terminal main, still open" in \
            s.agent.messages[1]["content"]  # fmt: skip
    finally:
        s.close()


def test_long_new_output_is_cut_like_bash_and_the_session_ends_with_the_agent(repo, fake_model):
    recs, _, s = _run(repo, fake_model, [
        ("terminal_open", {"session": "main"}),
        ("terminal_send", {"session": "main", "input": ["seq 100000 | sed 's/$/ filler text/'\n"],
                           "wait_for": r"^100000 filler text\n\$$", "timeout": 60, "read": "new"}),
        ("terminal_send", {"session": "main", "input": ["sleep 1000 &\n"]}),
    ], flags={"mode": "auto"})  # fmt: skip
    out = recs[1]["result"]
    assert "characters elided; the whole output is in" in out and len(out) < 31000
    assert out.rstrip().endswith("100000 filler text\n$")
    full = open(recs[1]["data"]["full_output"]).read()  # the whole read, redacted, in the session's scratch folder
    assert "earlier lines were not kept (the scrollback holds 5000)" in full and "96000 filler text" in full
    # the agent session is over (s.close()): its terminal sessions are gone, the background `sleep` with them
    sessions = s.agent.env.terminals.sessions
    assert not sessions


def test_a_wait_ends_when_the_user_interrupts(repo, tmp_path):
    import threading

    from agent.environment import Environment
    from agent.tools.terminal import TerminalOpenTool, TerminalReadTool

    env = Environment(repo, scratch_dir=tmp_path / "s")
    env.interrupt = threading.Event()
    try:
        ctx = ToolContext(env, ToolState())
        TerminalOpenTool().run({"session": "m"}, ctx)
        threading.Timer(0.5, env.interrupt.set).start()
        res = TerminalReadTool().run({"session": "m", "wait_for": "never-shows", "timeout": 60}, ctx)
        assert res.data["waited"] == "interrupted" and "interrupted by the user" in res.output
    finally:
        env.close()


def test_undo_restores_files_a_terminal_changed(repo, fake_model):
    fake_model.script = [
        reply(tools=[("terminal_open", {"session": "main"})]),
        reply(tools=[("terminal_send", {"session": "main", "input": ["echo broken > calc.py; echo ok-$((1+1))\n"],
                                        "wait_for": "^ok-2$"})]),  # fmt: skip
        reply("done"),
    ]
    s = make_session(repo, fake_model, flags={"mode": "auto"})
    try:
        before = (repo / "calc.py").read_text()
        s.agent.run("break it in a terminal")
        assert (repo / "calc.py").read_text() == "broken\n"
        s.agent.rewind(1)
        assert (repo / "calc.py").read_text() == before
    finally:
        s.close()


def test_plan_mode_opens_a_shell_runs_only_read_only_lines_and_no_keystrokes(repo, fake_model):
    recs, _, _ = _run(repo, fake_model, [
        ("terminal_open", {"session": "main"}),
        ("terminal_send", {"session": "main", "input": ["ls\n"], "wait_for": "calc.py"}),
        ("terminal_send", {"session": "main", "input": ["touch x\n"]}),
        ("terminal_open", {"session": "py", "command": "python3"}),
    ], flags={"mode": "plan"})  # fmt: skip
    assert [r["decision"] for r in recs] == ["allow", "allow", "denied", "denied"]
    assert "calc.py" in recs[1]["result"] and "plan mode" in recs[2]["result"]


def test_pre_tool_use_hooks_on_bash_see_the_line_a_terminal_would_run(repo, fake_model, tmp_path):
    seen = tmp_path / "seen.jsonl"
    hook = tmp_path / "guard.sh"
    hook.write_text('#!/bin/bash\ninput=$(cat)\necho "$input" >> ' + str(seen) + "\n"
                    "if echo \"$input\" | grep -q 'rm -rf'; then echo 'no recursive deletes' >&2; exit 2; fi\n")
    hook.chmod(0o755)
    (repo / ".glm5").mkdir(exist_ok=True)
    settings = f'[hooks]\nPreToolUse = [{{ matcher = "bash", command = "{hook}" }}]\n'
    (repo / ".glm5" / "settings.toml").write_text(settings)
    (repo / "build").mkdir()
    recs, _, _ = _run(repo, fake_model, [
        ("terminal_open", {"session": "main"}),
        ("terminal_send", {"session": "main", "input": ["rm -rf build\n"]}),
        ("terminal_send", {"session": "main", "input": ["ls\n"], "wait_for": "calc.py"}),
    ], flags={"mode": "auto"})  # fmt: skip
    assert [r["decision"] for r in recs] == ["allow", "blocked", "allow"]
    assert "no recursive deletes" in recs[1]["result"] and (repo / "build").is_dir()
    events = [json.loads(line) for line in seen.read_text().splitlines()]
    assert [e["tool_input"] for e in events] == [{"command": "rm -rf build"}, {"command": "ls"}]
