"""Modes, rules (deny wins), compound commands, the path fence."""

from __future__ import annotations

import pytest

from agent.command_analysis import is_read_only
from agent.environment import Environment
from agent.permissions import ALLOW, ASK, DENY, Permissions, Rule
from agent.tools.base import EDIT, EXECUTE, OTHER, READ


def perms(mode="ask", allow=(), ask=(), deny=()):
    return Permissions(
        mode, [Rule.parse(r) for r in allow], [Rule.parse(r) for r in ask], [Rule.parse(r) for r in deny]
    )


def test_modes(tmp_path):
    env = Environment(tmp_path)
    table = {  # (tool, kind, subject): expected per mode ask, accept-edits, plan, auto
        ("read", READ, "a.py"): (ALLOW, ALLOW, ALLOW, ALLOW),
        ("edit", EDIT, "a.py"): (ASK, ALLOW, DENY, ALLOW),
        ("bash", EXECUTE, "pytest -q"): (ASK, ASK, DENY, ALLOW),
        ("bash", EXECUTE, "git status && ls -la"): (ALLOW, ALLOW, ALLOW, ALLOW),
        ("bash", EXECUTE, "ls > out.txt"): (ASK, ASK, DENY, ALLOW),
        ("todo", OTHER, None): (ALLOW, ALLOW, ALLOW, ALLOW),
        ("mcp__x__y", EXECUTE, None): (ASK, ASK, DENY, ALLOW),
    }
    for (tool, kind, subject), want in table.items():
        got = tuple(perms(m).check(tool, kind, subject, env).action for m in ("ask", "accept-edits", "plan", "auto"))
        assert got == want, (tool, subject)


def test_rules_and_precedence(tmp_path):
    env = Environment(tmp_path)
    p = perms("auto", allow=["bash(git push)"], deny=["bash(git push)", "edit(secrets/**)"])
    assert p.check("bash", EXECUTE, "git push origin main", env).action == DENY  # deny wins over allow
    assert p.check("bash", EXECUTE, "ls && git push", env).action == DENY  # any part denied
    assert p.check("bash", EXECUTE, "git pushx", env).action == ALLOW  # a prefix is a whole word
    assert p.check("edit", EDIT, "secrets/key.txt", env).action == DENY
    p = perms("ask", allow=["bash(pytest)", "bash(npm run:*)"], ask=["bash(pytest --slow)"])
    assert p.check("bash", EXECUTE, "pytest -q tests", env).action == ALLOW
    assert p.check("bash", EXECUTE, "pytest -q 2>&1", env).action == ALLOW
    assert p.check("bash", EXECUTE, "npm run build", env).action == ALLOW
    assert p.check("bash", EXECUTE, "pytest -q && rm -rf /", env).action == ASK  # every part must be allowed
    assert p.check("bash", EXECUTE, "pytest --slow", env).action == ASK  # ask beats allow
    assert perms("ask", allow=["mcp__github__*"]).check("mcp__github__issue", EXECUTE, None, env).action == ALLOW
    with pytest.raises(ValueError, match="bad permission rule"):
        Rule.parse("bash(")


def test_paths_outside_the_repository_are_refused(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "shared").mkdir()
    env = Environment(tmp_path / "repo", extra_dirs=(str(tmp_path / "shared"),))
    p = perms("auto")
    assert p.check("read", READ, "/etc/passwd", env).action == DENY
    assert p.check("write", EDIT, "../outside.txt", env).action == DENY
    assert p.check("read", READ, str(tmp_path / "shared" / "x"), env).action == ALLOW
    assert p.check("write", EDIT, ".glm5/settings.toml", env).action == DENY  # no self-granted permissions
    assert p.check("edit", EDIT, ".git/config", env).action == DENY
    assert p.check("read", READ, ".git/config", env).action == ALLOW
    (tmp_path / "repo" / "link").symlink_to("/etc")
    assert p.check("read", READ, "link/passwd", env).action == DENY  # symlinks are followed


def test_read_only_commands():
    assert is_read_only("git diff HEAD~1 | head -50")
    assert not is_read_only("cat $(which python)")
    assert not is_read_only("rm -rf build")
    assert not is_read_only("ls & rm -rf build")
    assert is_read_only("git log -5 2>&1 | head")  # a background `&` separates commands too
    assert not is_read_only("git diff --output=patch.txt")
    assert not is_read_only("rg --pre ./run.sh x")
