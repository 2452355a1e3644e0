"""Fence 1 (issue 15): nothing a sandboxed command configures in git runs on the host.

Each attack writes a marker to a host path that is NOT writable inside the sandbox (/var/tmp is read-only there),
so a marker that appears proves a process outside the sandbox ran the payload.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from agent.checkpoints import Checkpoints
from agent.environment import Environment
from agent.git_safe import dangerous_keys, git
from agent.sandbox import Sandbox, probe

needs_bwrap = pytest.mark.skipif(probe(False) is not None, reason=f"bwrap unusable here: {probe(False)}")


@pytest.fixture
def marker():
    p = Path(f"/var/tmp/glm5-pwned-{uuid.uuid4().hex}")
    yield p
    p.unlink(missing_ok=True)


def _payload(marker: Path) -> str:
    return f"sh {marker.name}.sh"


def _plant_config(repo: Path, marker: Path) -> None:
    """What a hostile repository (or a command run with the sandbox off) leaves in .git: every program hook."""
    (repo / f"{marker.name}.sh").write_text(f"echo ran > {marker}\ncat\n")
    cfg = repo / ".git" / "config"
    cfg.write_text(
        cfg.read_text()
        + f'[filter "evil"]\n\tclean = {_payload(marker)}\n\tsmudge = {_payload(marker)}\n\trequired = true\n'
        + f'[filter "x=y"]\n\tclean = {_payload(marker)}\n'
        + f"[core]\n\tfsmonitor = {_payload(marker)}\n\thooksPath = {repo}/hooks\n"
        + f'[diff]\n\texternal = {_payload(marker)}\n[diff "evil"]\n\ttextconv = {_payload(marker)}\n'
        + "[include]\n\tpath = ../included.cfg\n"
    )
    (repo / "included.cfg").write_text(f'[filter "inc"]\n\tclean = {_payload(marker)}\n')
    (repo / "hooks").mkdir()
    for hook in ("reference-transaction", "post-index-change", "pre-commit"):
        h = repo / "hooks" / hook
        h.write_text(f"#!/bin/sh\necho ran > {marker}\n")
        h.chmod(0o755)
    (repo / ".gitattributes").write_text("* filter=evil diff=evil\n*.py filter=inc\n*.txt filter=x=y\n")


def test_host_git_runs_no_configured_program(repo, marker):
    _plant_config(repo, marker)
    (repo / "calc.py").write_text("changed\n")
    (repo / "new.txt").write_text("new\n")
    cp = Checkpoints(repo, "attack")
    first = cp.snapshot("after a command")
    (repo / "calc.py").write_text("changed again\n")
    cp.snapshot("again")
    cp.restore(first.commit)
    git(repo, "diff", "HEAD", "--stat")
    git(repo, "status", "--porcelain")
    assert not marker.exists(), "a host-side git ran a program from the repository's config"
    # and the snapshot holds the bytes on disk, not a filter's output
    assert (repo / "calc.py").read_text() == "changed\n"


def test_the_attack_works_with_plain_git(repo, marker):
    """The control: the same planted config does run the payload through an ordinary `git add`, so the test
    above would fail without git_safe."""
    _plant_config(repo, marker)
    (repo / "calc.py").write_text("changed\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], capture_output=True)
    assert marker.exists()


def test_dangerous_keys_are_found():
    listing = "\0".join(
        ["filter.a.clean\nx", "filter.x=y.smudge\nx", "core.fsmonitor\nx", "diff.p.textconv\nx", "user.name\nme"]
    )
    keys = dangerous_keys(listing + "\0")
    assert "user.name" not in keys and "filter.x=y.smudge" in keys and len(keys) == 4


@needs_bwrap
def test_sandboxed_command_cannot_write_git_config(repo, tmp_path, marker):
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    before = (repo / ".git" / "config").read_text()
    r = env.execute(f"git config filter.evil.clean \"sh -c 'touch {marker}'\"; echo '* filter=evil' > .gitattributes")
    assert (repo / ".git" / "config").read_text() == before
    assert env.execute("touch .git/hooks/pre-commit").returncode != 0
    assert env.execute("echo x > .glm5/settings.toml").returncode != 0
    # the working tree stays writable (the .gitattributes line was written)
    assert (repo / ".gitattributes").exists(), r.output
    Checkpoints(repo, "s").snapshot("after")
    assert not marker.exists()


@needs_bwrap
def test_symlinked_git_dir_is_protected_at_its_real_path(tmp_path, marker):
    """`.git -> gitreal`: binding `.git` alone would leave `gitreal/config` writable through its own name."""
    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    os.rename(repo / ".git", repo / "gitreal")
    os.symlink("gitreal", repo / ".git")
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    assert env.execute("echo ok > inside.txt").returncode == 0  # the sandbox runs
    assert env.execute("echo '[core]' >> gitreal/config").returncode != 0
    assert env.execute("echo '[core]' >> .git/config").returncode != 0


@needs_bwrap
def test_root_inside_cannot_remount_writable(repo, tmp_path, marker):
    """As root, CAP_SYS_ADMIN inside the namespace would remount `/` read-write: capabilities are dropped."""
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    r = env.execute(
        f"echo inside; mount -o remount,bind,rw / 2>/dev/null; mount -o remount,bind,rw /var/tmp; touch {marker}"
    )
    assert "inside" in r.output and not marker.exists(), r.output


def test_a_hostile_core_worktree_does_not_move_the_repository(repo):
    """`core.worktree = /etc` would make /etc the session's repository, writable inside the sandbox."""
    from agent.checkpoints import git_root

    with open(repo / ".git" / "config", "a") as f:
        f.write("[core]\n\tworktree = /etc\n")
    assert git_root(repo) is None


def test_a_core_worktree_naming_a_parent_does_not_make_it_the_repository(tmp_path):
    """`core.worktree = ../..` (shipped in .git/config, or set by an approved command) names a folder that holds the
    one we started in, so the old check (the start inside the working tree) passed and the parent -- the user's
    home -- became the root: edited without a prompt, writable in the sandbox. Only a working tree whose own .git
    is the git dir counts; a linked worktree and a submodule (.git a file naming the git dir) still do."""
    from agent.checkpoints import git_root

    home = tmp_path / "home"
    evil = home / "Downloads" / "evil"
    evil.mkdir(parents=True)
    run = lambda cwd, *a: subprocess.run(["git", *a], cwd=cwd, check=True, capture_output=True)  # noqa: E731
    run(evil, "init", "-q")
    assert git_root(evil) == evil.resolve()
    run(evil, "config", "core.worktree", "../..")
    assert git_root(evil) is None and git_root(home) is None

    main = tmp_path / "main"
    main.mkdir()
    run(main, "init", "-q")
    run(main, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "0")
    run(main, "worktree", "add", "-q", str(tmp_path / "wt"))
    assert git_root(tmp_path / "wt") == (tmp_path / "wt").resolve()


@needs_bwrap
def test_host_kernel_knobs_are_read_only_inside(repo, tmp_path):
    """uid 0 without capabilities could still write host sysctls through the sandbox's /proc; writing back the
    current value is a harmless probe."""
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    r = env.execute(
        'echo inside; v=$(cat /proc/sys/kernel/printk) && echo "$v" > /proc/sys/kernel/printk && echo WROTE'
    )
    assert "inside" in r.output and "WROTE" not in r.output, r.output  # the sandbox ran, the write failed


@needs_bwrap
def test_the_attack_end_to_end_through_the_agent(repo, fake_model, marker):
    """The issue's attack as a hostile model runs it: a bash call plants a filter, the checkpoint after the
    call runs `git add -A` on the host. No process outside the sandbox may run the payload."""
    from tests.agent.fake_model import reply
    from tests.agent.helpers import make_session

    (repo / "p.sh").write_text(f"echo ran > {marker}\ncat\n")
    attack = (
        "git config filter.evil.clean 'sh p.sh'; git config core.fsmonitor 'sh p.sh';"
        " echo '* filter=evil' > .gitattributes; echo changed > calc.py"
    )
    fake_model.script = [reply(tools=[("bash", {"command": attack})]), reply("done")]
    s = make_session(repo, fake_model, flags={"sandbox": True, "mode": "auto"})
    try:
        s.agent.run("do it")
        assert s.agent.env.sandbox.active
        assert s.agent.checkpoints.n >= 1  # the snapshot after the call was taken
    finally:
        s.close()
    assert (repo / ".gitattributes").exists() and not marker.exists()


def test_host_programs_never_come_from_a_folder_commands_can_write(repo, tmp_path, marker, monkeypatch):
    """With the repository's .venv active (`<repo>/.venv/bin` first on PATH), one approved command could plant a
    `git` that the next checkpoint runs on the host, outside the sandbox, or a `bwrap` that runs commands with no
    sandbox. Once a session's Environment guards the repository, git, bwrap, rg and the hooks' bash are found on
    PATH without it."""
    from agent import host_path
    from agent.hooks import Hooks

    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("git", "bwrap", "rg", "bash"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} > {marker}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}.{os.pathsep}{os.environ['PATH']}")
    Environment(repo, sandbox=Sandbox(False), scratch_dir=tmp_path / "scratch")
    for name in ("git", "bwrap", "rg", "bash"):
        found = host_path.which(name)
        assert found is None or not found.startswith(str(repo)), found
    assert str(bin_dir) not in host_path.path().split(os.pathsep) and "." not in host_path.path().split(os.pathsep)
    Checkpoints(repo, "s1").snapshot("turn 1")
    assert git(repo, "status", "--short", check=False).returncode == 0
    if probe(False) is None:
        argv = Sandbox(True).wrap(["true"], root=repo, cwd=repo, scratch=tmp_path / "scratch")
        assert argv[0] == host_path.which("bwrap") and not argv[0].startswith(str(repo))
    Hooks({"SessionStart": [{"command": "true"}]}, repo, "s1").run("SessionStart", {})
    assert not marker.exists(), marker.read_text()


def test_hooks_get_the_commands_environment_not_the_agents_keys(repo, tmp_path, monkeypatch):
    from agent.hooks import Hooks

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-hook-0123456789")
    monkeypatch.setenv("MY_WEBHOOK_URL", "https://hooks.example/1")
    out = tmp_path / "env.txt"
    hook = {"command": f"env > {out}", "pass_env": ["MY_WEBHOOK_URL"], "env": {"LEVEL": "3"}}
    Hooks({"SessionStart": [hook]}, repo, "s1").run("SessionStart", {})
    seen = out.read_text()
    assert "sk-test-hook" not in seen and "MY_WEBHOOK_URL=https://hooks.example/1" in seen and "LEVEL=3" in seen
    assert "PATH=" in seen
