"""Fence 4 (issue 15): the file tools check real paths for every argument, and at the moment of access."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agent.environment import Environment
from agent.tools import EditTool, GlobTool, GrepTool, ReadTool, WriteTool
from agent.tools.base import ToolContext, ToolError, ToolState


@pytest.fixture
def ctx(repo, tmp_path):
    return ToolContext(Environment(repo, scratch_dir=tmp_path / "scratch"), ToolState())


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("TOPSECRET\n")
    return d


def test_glob_pattern_cannot_climb_out(ctx, outside):
    with pytest.raises(ToolError, match="inside the folder"):
        GlobTool().run({"pattern": "../outside/*"}, ctx)
    with pytest.raises(ToolError):
        GlobTool().run({"pattern": "**/../../outside/*"}, ctx)


def test_glob_leaves_out_links_out_of_the_repository(ctx, repo, outside):
    (repo / "leak.txt").symlink_to(outside / "secret.txt")
    out = GlobTool().run({"pattern": "*.txt"}, ctx).output
    assert "leak.txt" not in out


def test_python_grep_does_not_follow_a_link_out(ctx, repo, outside):
    (repo / "leak.txt").symlink_to(outside / "secret.txt")
    (repo / "linkdir").symlink_to(outside)
    out = GrepTool(use_ripgrep=False).run({"pattern": "TOPSECRET"}, ctx).output
    assert out.startswith("no matches")


def test_read_refuses_a_link_out(ctx, repo, outside):
    (repo / "leak.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolError, match="outside the repository"):
        ReadTool().run({"path": "leak.txt"}, ctx)
    (repo / "inner.py").symlink_to("calc.py")  # a link inside the repository still reads
    assert "def add" in ReadTool().run({"path": "inner.py"}, ctx).output


def test_a_link_to_git_data_is_not_writable(ctx, repo):
    (repo / "gitdir").symlink_to(".git")
    with pytest.raises(ToolError, match=r"\.git/"):
        WriteTool().run({"path": "gitdir/hooks/pre-commit", "content": "#!/bin/sh\nid\n"}, ctx)
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()


def test_a_file_swapped_for_a_link_after_the_check_is_not_written_through(ctx, repo, tmp_path):
    """TOCTOU: permissions approved `notes.txt`, then a background job made it a link to a host file."""
    victim = tmp_path / f"bashrc-{uuid.uuid4().hex}"
    victim.write_text("original\n")
    (repo / "notes.txt").write_text("notes\n")
    ReadTool().run({"path": "notes.txt"}, ctx)
    st = (repo / "notes.txt").stat()
    os.unlink(repo / "notes.txt")
    os.symlink(victim, repo / "notes.txt")
    os.utime(repo / "notes.txt", ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    ctx.state.read_files[str(repo / "notes.txt")] = victim.stat().st_mtime_ns  # the freshness check passes
    with pytest.raises(ToolError, match="outside the repository"):
        WriteTool().run({"path": "notes.txt", "content": "echo pwned\n"}, ctx)
    with pytest.raises(ToolError, match="outside the repository"):
        EditTool().run({"path": "notes.txt", "old_string": "original", "new_string": "pwned"}, ctx)
    assert victim.read_text() == "original\n"


def test_write_does_not_create_folders_through_a_link(ctx, repo, outside):
    (repo / "out").symlink_to(outside)
    with pytest.raises(ToolError, match="outside the repository"):
        WriteTool().run({"path": "out/new/dir/x.txt", "content": "x"}, ctx)
    assert not (outside / "new").exists()


def test_symlinked_repository_root(tmp_path, repo):
    """The repository reached through a link is the same repository: tools work, nothing outside opens."""
    link = tmp_path / "via-link"
    link.symlink_to(repo)
    ctx = ToolContext(Environment(link, scratch_dir=tmp_path / "s"), ToolState())
    assert "def add" in ReadTool().run({"path": "calc.py"}, ctx).output
    WriteTool().run({"path": "new.txt", "content": "hi\n"}, ctx)
    assert (repo / "new.txt").read_text() == "hi\n" and Path(ctx.env.root) == repo.resolve()


def test_host_writes_in_the_scratch_folder_do_not_follow_planted_links(repo, tmp_path):
    """Commands can write the scratch folder; a link planted at the name of the next output or job log must not
    make the host write through it."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    victim = tmp_path / f"victim-{uuid.uuid4().hex}"
    victim.write_text("original\n")
    (scratch / "output-1.txt").symlink_to(victim)
    (scratch / "job-1.log").symlink_to(victim)
    env = Environment(repo, scratch_dir=scratch, inline_chars=50)
    assert env.execute("seq 1 100").full_output_path
    job = env.start_background("echo from-job")
    job.wait(10)
    assert victim.read_text() == "original\n"
    assert "from-job" in job.log_path.read_text()


def test_an_instruction_file_linked_out_of_the_repository_is_not_read(repo, tmp_path):
    from agent.context import instructions_text

    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = TOPSECRET123\n")
    (repo / "AGENTS.md").symlink_to(secret)
    assert "TOPSECRET" not in instructions_text(repo, repo)
    (repo / "AGENTS.md").unlink()
    (repo / "AGENTS.md").write_text("use tabs\n")
    assert "use tabs" in instructions_text(repo, repo)


def test_a_shown_root_maps_only_into_the_repository(repo, tmp_path, outside):
    """A bench trial shows the model its folder as /app: /app/... is the repository, and a path that climbs out of
    /app (normalised first) is not mapped, so the fences see it as what it is."""
    env = Environment(repo, scratch_dir=tmp_path / "scratch", shown_root="/app")
    ctx = ToolContext(env, ToolState())
    real = repo.resolve()
    assert env.resolve("/app") == real and env.resolve("/app/src/x.py") == real / "src" / "x.py"
    assert env.resolve("/app/../etc/passwd") == Path("/etc/passwd") and env.resolve("/apple") == Path("/apple")
    assert env.resolve("x.py") == real / "x.py" and env.shown(real / "a" / "b.py") == Path("/app/a/b.py")
    (repo / "note.txt").write_text("hi\n")
    assert "hi" in ReadTool().run({"path": "/app/note.txt"}, ctx).output
    with pytest.raises(ToolError):
        ReadTool().run({"path": f"/app/../{os.path.relpath(outside / 'secret.txt', '/')}"}, ctx)
