"""Fences 3 and 4 (issue 15): permission rules judge what bash runs, and shell reads outside the repository ask.

Every attack from the issue is here, plus the next ones found (wrappers, `git -c`, `find -exec`, here-docs...).
The property tests check the parser against bash itself: for any line the parser calls static, bash splits it
into exactly the words the parser saw.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.command_analysis import is_read_only
from agent.environment import Environment
from agent.permissions import ALLOW, ASK, DENY, Permissions, Rule, narrowest_rule
from agent.shell import parse
from agent.tools.base import EDIT, EXECUTE, READ


def perms(mode="ask", allow=(), ask=(), deny=()):
    return Permissions(
        mode, [Rule.parse(r) for r in allow], [Rule.parse(r) for r in ask], [Rule.parse(r) for r in deny]
    )


@pytest.fixture
def env(repo, tmp_path):
    return Environment(repo, scratch_dir=tmp_path / "scratch")


@pytest.mark.parametrize(
    "command",
    [
        "git log $(rm -rf ~)",
        "git log `rm -rf ~`",
        "git log > ~/.bashrc",
        "git log >> .bashrc",
        "git log && rm -rf ~",
        "git log; rm -rf ~",
        "git log | sh",
        "git log & rm -rf ~",
        "git log <(rm -rf ~)",
        "git log\nrm -rf ~",
        "GIT_EXTERNAL_DIFF=./evil git log",
        "git -c core.pager=./evil log",
        "git log --output=../x",
        'eval "git log"',
        "exec git log",
        "sh -c 'git log'",
        "git log ${HOME:-$(id)}",
        "git log $'\\x41'",
        "git log {a,b}",
    ],
)
def test_a_rule_allows_only_the_command_itself(env, command):
    p = perms("ask", allow=["bash(git log)"])
    assert p.check("bash", EXECUTE, command, env).action == ASK, command
    assert perms("plan").check("bash", EXECUTE, command, env).action in (ASK, DENY)


def test_the_rule_still_allows_its_command(env):
    p = perms("ask", allow=["bash(git log)", "bash(python -m pytest:*)"])
    assert p.check("bash", EXECUTE, "git log --oneline -5", env).action == ALLOW
    assert p.check("bash", EXECUTE, "python -m pytest -q 2>&1 | tail -5", env).action == ALLOW
    assert p.check("bash", EXECUTE, "python -m pytest -q > /dev/null", env).action == ALLOW
    assert p.check("bash", EXECUTE, "python x.py", env).action == ASK


@pytest.mark.parametrize(
    "command,inner",
    [
        ("timeout 5 rm -rf build", "rm"),
        ("nice -n 5 rm -rf build", "rm"),
        ("xargs rm < list.txt", "rm"),
        ("find . -name '*.pyc' -exec rm {} ;", "rm"),
        ("sudo rm -rf build", "rm"),
        ("sh -c 'rm -rf build'", "rm"),
        ("bash -c 'ls && rm -rf build'", "rm"),
        ("env X=1 rm -rf build", "rm"),
        ("nohup rm -rf build", "rm"),
    ],
)
def test_deny_looks_through_wrappers(env, command, inner):
    assert perms("auto", deny=[f"bash({inner}:*)"]).check("bash", EXECUTE, command, env).action == DENY


def test_auto_mode_asks_when_a_deny_rule_cannot_be_checked(env):
    p = perms("auto", deny=["bash(rm:*)"])
    assert p.check("bash", EXECUTE, 'eval "$CMD"', env).action == ASK
    assert p.check("bash", EXECUTE, "$(echo rm) -rf x", env).action == ASK
    assert p.check("bash", EXECUTE, "ls -la", env).action == ALLOW
    assert perms("auto").check("bash", EXECUTE, 'eval "$CMD"', env).action == ALLOW  # no deny rule: auto is auto


@pytest.mark.parametrize(
    "command",
    [
        "sudo ls",
        "find . -delete",
        "find . -exec cat {} +",
        "find . -fprint out.txt",
        "rg --pre ./run.sh x",
        "git diff --ext-diff",
        "git -c diff.external=./x diff",
        "git -C /etc log",
        "cat <<EOF\n$(id)\nEOF",
        "ls | xargs cat",
        "cat $HOME/.netrc",
    ],
)
def test_looking_commands_that_run_or_write_are_not_read_only(env, command):
    assert not is_read_only(command, env), command
    assert perms("ask").check("bash", EXECUTE, command, env).action == ASK


def test_here_docs(env):
    assert perms("ask").check("bash", EXECUTE, "cat <<'EOF'\n$(id) `x`\nEOF", env).action == ALLOW
    assert perms("ask").check("bash", EXECUTE, "cat <<EOF\nplain text\nEOF\ngit status", env).action == ALLOW
    assert perms("ask").check("bash", EXECUTE, "cat <<EOF\n$(id)\nEOF", env).action == ASK


@pytest.mark.parametrize(
    "command",
    ["cat ~/.ssh/id_rsa", "cat /etc/passwd", "head -5 ../other/secret", "grep -r key /root", "cat < /etc/shadow",
     "ls ../*", "cd .. && cat x", "tail ~root/.bash_history", "git diff --no-index /etc/passwd calc.py",
     # bare `cd` goes home; `cd -L` is an option, not a folder; git diff compares files outside the repository
     # with --no-index on its own; a short option's attached value names a file
     "cd; cat .bashrc", "cd && ls -la", "cd -L; cat ../etc/hostname", "cd - && ls", "git diff /etc/passwd /dev/null",
     "git diff --stat /etc/os-release calc.py", "git log -p -- ../other", "file -f/etc/hostname"],
)  # fmt: skip
def test_shell_reads_outside_the_repository_ask(env, command):
    for mode in ("ask", "accept-edits", "plan"):
        assert perms(mode).check("bash", EXECUTE, command, env).action == ASK, (mode, command)


def test_reads_inside_the_repository_still_run(env):
    for command in ("cat calc.py", "grep -r add .", "ls *.py", "head -n 3 calc.py | wc -l", "cat /etc/passwd1"[:0]):
        if command:
            assert perms("plan").check("bash", EXECUTE, command, env).action == ALLOW, command


def test_a_glob_or_symlink_out_of_the_repository_is_seen(env, repo):
    (repo / "sneaky").symlink_to("/etc")
    assert perms("ask").check("bash", EXECUTE, "cat sneaky/passwd", env).action == ASK
    assert perms("ask").check("bash", EXECUTE, "cat sneak*/passwd", env).action == ASK
    # `..` after a link is the parent of where it points, as the kernel resolves it: sneaky/.. is /, not the repo
    (repo / "docs").symlink_to("/etc/ssl")
    for command in ("cat docs/../passwd", "ls docs/../", "cd docs/.. && cat passwd", "git diff docs/../passwd"):
        assert perms("ask").check("bash", EXECUTE, command, env).action == ASK, command


def test_git_revisions_and_repository_paths_stay_read_only(env):
    for command in ("git diff HEAD~1 -- calc.py", "git log --oneline main", "git show HEAD:calc.py",
                    "git diff --stat", "cd . && git status", "git log origin/main..HEAD"):  # fmt: skip
        assert perms("plan").check("bash", EXECUTE, command, env).action == ALLOW, command


def test_an_exact_rule_does_not_match_its_words_split_over_lines(env):
    # `chmod +x ./run.sh` allowed, then `chmod +x` NEWLINE `./run.sh` runs the repository's script
    p = perms("ask", allow=["bash(chmod +x ./run.sh)"])
    assert p.check("bash", EXECUTE, "chmod  +x\t./run.sh ", env).action == ALLOW
    assert p.check("bash", EXECUTE, "chmod +x\n./run.sh", env).action == ASK


def test_file_tools_refuse_links_into_git_data(env, repo):
    (repo / "gitdir").symlink_to(".git")
    p = perms("accept-edits")
    assert p.check("write", EDIT, "gitdir/config", env).action == DENY
    assert p.check("edit", EDIT, "gitdir/hooks/pre-commit", env).action == DENY
    assert p.check("read", READ, "gitdir/config", env).action == ALLOW


@pytest.mark.parametrize(
    "command,rule",
    [
        ("python -m pytest -q", "bash(python -m pytest:*)"),
        ("python x.py --fast", "bash(python x.py:*)"),
        ("python -c 'print(1)'", "bash(python -c 'print(1)')"),
        ("npm run build -- --watch", "bash(npm run build:*)"),
        ("git commit -m 'fix it'", "bash(git commit:*)"),
        ("pytest -q tests", "bash(pytest:*)"),
        ("rm -rf build", "bash(rm -rf build)"),
        ("make", "bash(make:*)"),
        ("ls && rm x", "bash(ls && rm x)"),
        ("FOO=1 ./run.sh", "bash(FOO=1 ./run.sh)"),
        ("uv run pytest -x", "bash(uv run pytest:*)"),
    ],
)
def test_narrowest_rule(command, rule, env):
    assert narrowest_rule(command) == rule
    # the proposed rule allows the command it was made for
    assert perms("ask", allow=[rule]).check("bash", EXECUTE, command, env).action == ALLOW


def test_an_exact_rule_for_a_destructive_command_stays_exact(env):
    p = perms("ask", allow=[narrowest_rule("rm -rf build")])
    assert p.check("bash", EXECUTE, "rm -rf build", env).action == ALLOW
    assert p.check("bash", EXECUTE, "rm -rf build ~", env).action == ASK
    assert perms("auto", deny=["bash(rm)"]).check("bash", EXECUTE, "rm -rf x", env).action == DENY  # deny: prefix


def test_always_on_python_does_not_allow_every_python(env):
    rule = narrowest_rule("python x.py")
    p = perms("ask", allow=[rule])
    assert p.check("bash", EXECUTE, "python evil.py", env).action == ASK
    assert p.check("bash", EXECUTE, "python -c 'import os'", env).action == ASK


# -- the parser against bash ---------------------------------------------------------------------------------

_chars = st.sampled_from(list("ab ./-_=*?'\"\\$`;&|<>(){}[]~#!\t\n,:@%^+") + ["x y", "$(", "${", "&&", "||", "2>&1"])
_lines = st.lists(_chars, max_size=24).map("".join)


@settings(
    max_examples=int(os.environ.get("GLM5_HYPOTHESIS_N", 300)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(_lines)
@example("\n:")  # a line that starts with a newline: its one command is `:`, not printf's argument
def test_parser_never_crashes_and_static_lines_split_as_bash_does(tmp_path_factory, line):
    p = parse(line)
    assert isinstance(p.problems, list)
    if p.problems or len(p.commands) != 1 or p.commands[0].redirects:
        return
    words = p.commands[0].words
    if any(w.glob or w.tilde for w in words) or not words:
        return
    # bash's own split of the same words, with a harmless program in front: printf prints each argument (the
    # line's leading blanks and newlines go, or a newline would end printf's command before the words)
    d = tmp_path_factory.mktemp("sh")
    r = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line.lstrip()}"],
        capture_output=True,
        cwd=d,
        timeout=10,
        env={"PATH": os.defpath},
    )
    if r.returncode != 0:
        return
    got = r.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    assert got == [w.text for w in words], (line, got)


_plain = st.lists(st.sampled_from(list("ab ./-=,:@%+;&|<>") + ["&&", "||", "2>&1", "x y"]), max_size=12).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_plain, _plain)
def test_a_rule_never_allows_a_line_with_hidden_parts(env, a, b):
    """`git status` and a substitution anywhere after it (unquoted) is never allowed by the read-only list or a
    rule, whatever operators and words surround it."""
    line = f"git status {a}$(x){b}"
    assert perms("ask", allow=["bash(git status:*)"]).check("bash", EXECUTE, line, env).action != ALLOW


def test_a_repository_program_named_like_a_looking_command_asks(env, repo):
    (repo / "bin").mkdir()
    for command in ("./cat calc.py", "bin/git log", "./ls"):
        assert perms("ask").check("bash", EXECUTE, command, env).action == ASK, command
    assert perms("ask").check("bash", EXECUTE, "cat calc.py < /dev/null 2>/dev/null", env).action == ALLOW
    assert perms("ask").check("bash", EXECUTE, "git blame --contents /etc/shadow calc.py", env).action == ASK


@pytest.mark.parametrize("command", ["/usr/bin/git push", "git -C . push", "git --no-pager push origin", "\\git push"])
def test_deny_catches_other_spellings_of_the_program(env, command):
    assert perms("auto", deny=["bash(git push)"]).check("bash", EXECUTE, command, env).action == DENY


def test_git_commands_ask_when_the_repositorys_git_config_runs_programs(env, repo):
    # a repository shipped with .git/config: `git status` runs core.fsmonitor, `git diff` diff.external and the
    # textconv .gitattributes names, inside the sandbox but unasked (or on the host, with no sandbox)
    assert perms("ask").check("bash", EXECUTE, "git status && git diff", env).action == ALLOW
    subprocess.run(["git", "config", "diff.x.textconv", "sh tc.sh"], cwd=repo, check=True)
    d = perms("ask").check("bash", EXECUTE, "git diff", env)
    assert d.action == ASK and "diff.x.textconv" in d.reason
    assert perms("ask").check("bash", EXECUTE, "ls && git status", env).action == ASK
    assert perms("plan").check("bash", EXECUTE, "git log", env).action == DENY
    assert perms("plan").check("bash", EXECUTE, "ls", env).action == ALLOW  # only git's parts
