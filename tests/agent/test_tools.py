"""The built-in tools on a real repository: exact edits, read-before-edit, search with and without ripgrep, bash."""

from __future__ import annotations

import shutil
import time

import pytest

from agent.environment import Environment
from agent.tools import BashTool, EditTool, GlobTool, GrepTool, ReadTool, TodoTool, WriteTool
from agent.tools.base import ToolContext, ToolError, ToolState


@pytest.fixture
def ctx(repo, tmp_path):
    return ToolContext(Environment(repo, scratch_dir=tmp_path / "scratch", inline_chars=400), ToolState())


def test_read_numbers_lines_and_pages(ctx, repo):
    (repo / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = ReadTool().run({"path": "long.txt", "offset": 3, "limit": 2}, ctx).output
    assert out.splitlines()[0] == "     3\tline 3" and "read on with offset=5" in out
    with pytest.raises(ToolError, match="does not exist"):
        ReadTool().run({"path": "missing.txt"}, ctx)
    (repo / "bin.dat").write_bytes(b"\x00\x01")
    with pytest.raises(ToolError, match="binary"):
        ReadTool().run({"path": "bin.dat"}, ctx)


def test_edit_needs_a_read_exact_unique_match_and_keeps_crlf(ctx, repo):
    edit = EditTool()
    args = {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}
    with pytest.raises(ToolError, match="read calc.py before"):
        edit.run(args, ctx)
    ReadTool().run({"path": "calc.py"}, ctx)
    with pytest.raises(ToolError, match="not found"):
        edit.run({**args, "old_string": "a  - b"}, ctx)
    res = edit.run(args, ctx)
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n" and "-    return a - b" in res.data[
        "diff"
    ]

    (repo / "dup.txt").write_bytes(b"x = 1\r\nx = 1\r\n")
    ReadTool().run({"path": "dup.txt"}, ctx)
    with pytest.raises(ToolError, match="occurs 2 times"):
        edit.run({"path": "dup.txt", "old_string": "x = 1", "new_string": "x = 2"}, ctx)
    edit.run({"path": "dup.txt", "old_string": "x = 1", "new_string": "x = 2", "replace_all": True}, ctx)
    assert (repo / "dup.txt").read_bytes() == b"x = 2\r\nx = 2\r\n"

    time.sleep(0.01)
    (repo / "dup.txt").write_bytes(b"changed by someone else\n")
    with pytest.raises(ToolError, match="changed on disk"):
        edit.run({"path": "dup.txt", "old_string": "changed", "new_string": "c"}, ctx)


def test_write_creates_and_refuses_blind_overwrite(ctx, repo):
    WriteTool().run({"path": "pkg/new.py", "content": "x = 1\n"}, ctx)
    assert (repo / "pkg" / "new.py").read_text() == "x = 1\n"
    with pytest.raises(ToolError, match="read calc.py"):
        WriteTool().run({"path": "calc.py", "content": ""}, ctx)


def test_glob_skips_ignored_files(ctx, repo):
    (repo / "src").mkdir()
    (repo / "src" / "m.py").write_text("")
    (repo / "x.log").write_text("")
    out = GlobTool().run({"pattern": "**/*.py"}, ctx).output.splitlines()
    assert set(out) == {"calc.py", "test_calc.py", "src/m.py"}
    assert "no files" in GlobTool().run({"pattern": "*.log"}, ctx).output


def _corpus(repo):
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("import os\ndef add(x):\n    return x\n")
    (repo / "src" / "b.txt").write_text("add more\n")
    (repo / "skip.log").write_text("def add ignored\n")


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep is not installed")
def test_grep_ripgrep_and_python_agree(ctx, repo):
    _corpus(repo)
    for args in ({"pattern": r"def \w+"}, {"pattern": "add", "glob": "*.py"}, {"pattern": "add", "path": "src"},
                 {"pattern": "add", "path": "src/a.py"}):  # fmt: skip
        fast = GrepTool(use_ripgrep=True).run(args, ctx).output
        ref = GrepTool(use_ripgrep=False).run(args, ctx).output
        assert fast == ref, args


def test_grep_python_reference(ctx, repo):
    _corpus(repo)
    out = GrepTool(use_ripgrep=False).run({"pattern": r"def \w+"}, ctx).output.splitlines()
    assert out == ["calc.py:1:def add(a, b):", "src/a.py:2:def add(x):", "test_calc.py:4:def test_add():"]
    with pytest.raises(ToolError, match="bad regular expression"):
        GrepTool(use_ripgrep=False).run({"pattern": "("}, ctx)


def test_bash_exit_code_timeout_kills_group_and_long_output(ctx, repo):
    bash = BashTool()
    r = bash.run({"command": "echo out; echo err >&2; exit 3"}, ctx)
    assert r.is_error and "out" in r.output and "err" in r.output and r.data["returncode"] == 3

    t0 = time.monotonic()
    r = bash.run({"command": "(sleep 30; echo late > late.txt) & sleep 30", "timeout": 1}, ctx)
    assert time.monotonic() - t0 < 10 and r.data["timed_out"] and "killed" in r.output
    time.sleep(0.2)
    assert not (repo / "late.txt").exists()

    r = bash.run({"command": "seq 1 2000"}, ctx)
    assert "characters elided" in r.output and r.output.startswith("1\n") and r.output.endswith("2000\n[exit code 0]")
    assert open(r.data["full_output"]).read().count("\n") == 2000


def test_bash_background_job_output_read_later(ctx):
    r = BashTool().run({"command": "echo started; sleep 0.3; echo finished", "background": True}, ctx)
    log = r.data["log_path"]
    deadline = time.monotonic() + 10
    while "finished" not in open(log).read() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open(log).read() == "started\nfinished\n"
    assert ctx.env.is_allowed(ctx.env.resolve(log))  # the model may read its own job logs
    ctx.env.close()


def test_todo(ctx):
    r = TodoTool().run({"items": [{"content": "a", "status": "completed"}, {"content": "b", "status": "pending"}]}, ctx)
    assert r.output == "[x] a\n[ ] b" and ctx.state.todos[1]["content"] == "b"
    with pytest.raises(ToolError):
        TodoTool().run({"items": [{"content": "a", "status": "done"}]}, ctx)
