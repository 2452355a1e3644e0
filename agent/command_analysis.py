"""What a command line does, as far as static reading can tell: the facts permissions judge a command on.

    analyze(command, env) -> Analysis
      agent/shell.py parses the line into simple commands (split at `;`, `&&`, `||`, `|`, `&`) -> each one's
      argv, wrappers looked through (`timeout`, `nice`, `xargs`, `find -exec`, `sh -c '...'`, `sudo`: what a deny
      rule must still catch) -> what cannot be judged statically (substitutions, expansions, `eval`, `exec`,
      `sh -c`, `git -c`) -> files written by redirections -> path arguments that resolve (links followed) outside
      the repository -> commands not on the read-only allowlist (or with a flag that writes or runs), and the
      programs the repository's own git config runs (its `git status` does not only look)

Knows nothing of rules or modes: agent/permissions.py decides on these facts.
"""

from __future__ import annotations

import glob as globlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.git_safe import repository_programs
from agent.shell import HARMLESS_TARGETS, Parsed, SimpleCommand, parse

# Commands that only look: they run without asking in `ask` and `plan` modes (with their path arguments inside
# the repository, and none of the flags in UNSAFE_FLAGS).
READ_ONLY_COMMANDS = (
    "ls", "pwd", "cat", "head", "tail", "wc", "echo", "grep", "rg", "which", "file", "stat", "tree", "du", "cd",
    "find", "git status", "git diff", "git log", "git show", "git blame", "git rev-parse", "git ls-files",
)  # fmt: skip
# Flags that make a looking command write or run something.
UNSAFE_FLAGS = {
    "find": ("-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"),
    "rg": ("--pre", "--pre-glob", "--search-zip", "-z"),
    "tree": ("-o",),
    "file": ("-C", "--compile"),
    "git": ("--output", "--ext-diff", "--textconv", "-c", "--config-env", "--exec-path", "--git-dir", "--work-tree"),
}
# Commands whose argument is a command line: judged as that line (deny rules apply through them).
WRAPPERS = ("timeout", "nice", "nohup", "time", "command", "stdbuf", "ionice", "xargs")
# Commands that run strings, other users' privileges or replace the shell: always ask.
OPAQUE = ("eval", "exec", "source", ".", "sudo", "doas", "su", "pkexec", "runuser", "chroot", "env", "builtin")
SHELLS = ("sh", "bash", "zsh", "dash", "ksh")
NO_PATH_ARGS = ("echo", "which", "pwd")


@dataclass
class Analysis:
    """What a command line does, as far as static reading can tell."""

    parsed: Parsed
    commands: list[list[str]]  # every simple command's argv, wrappers looked through (for deny rules)
    top: list[list[str]]  # the simple commands as written (for allow rules)
    problems: list[str]  # reasons to ask
    writes: list[str]  # files written by redirections
    outside: list[str]  # path arguments that resolve outside the repository
    not_read_only: list[str]  # commands not on the read-only allowlist (or with a flag that writes or runs)
    # the programs the repository's own git config runs (core.fsmonitor, diff.external, a textconv): its git
    # commands do not only look
    git_programs: list[str] = field(default_factory=list)

    def looks_only(self, argv: list[str]) -> bool:
        """This one part is a read-only command here."""
        return _is_read_only(argv) and not (self.git_programs and _name(argv).startswith("git"))


def split_command(command: str) -> list[str]:
    return [str(c) for c in parse(command).commands]


def _unwrap(argv: list[str], problems: list[str], depth: int = 0) -> list[list[str]]:
    """argv plus the commands it runs: `timeout 5 x`, `xargs x`, `find -exec x {} ;`, `sh -c 'x'`, `sudo x`."""
    out = [argv]
    if not argv or depth > 4:
        return out
    cmd = os.path.basename(argv[0])
    rest = argv[1:]
    # Spellings of the same program a deny rule must still catch: `/usr/bin/git push`, `git -C . push`.
    if cmd != argv[0]:
        out.append([cmd, *rest])
    if cmd == "git":
        i = 0
        while i < len(rest) and rest[i].startswith("-"):
            i += 2 if rest[i] in ("-C", "-c", "--git-dir", "--work-tree", "--namespace") else 1
        if i:
            out.append(["git", *rest[i:]])
    if cmd in OPAQUE:
        problems.append(f"`{cmd}` runs a command this check cannot see")
        if cmd in ("sudo", "doas", "env", "command", "builtin", "exec", "nohup"):
            inner = [a for a in rest if not a.startswith("-") and "=" not in a]
            if inner:
                out += _unwrap(rest[rest.index(inner[0]) :], problems, depth + 1)
    elif cmd in SHELLS:
        if "-c" in rest:
            problems.append(f"`{cmd} -c` runs a string as a command")
            i = rest.index("-c")
            if i + 1 < len(rest):
                inner = parse(rest[i + 1])
                problems.extend(inner.problems)
                for c in inner.commands:
                    out += _unwrap(c.argv, problems, depth + 1)
        elif rest:
            problems.append(f"`{cmd}` runs a script")
    elif cmd in WRAPPERS:
        i = 0
        while i < len(rest) and (rest[i].startswith("-") or (cmd in ("timeout", "nice") and _numberish(rest[i]))):
            if cmd == "nice" and rest[i] == "-n" or cmd == "xargs" and rest[i] in ("-I", "-n", "-P", "-d", "-L"):
                i += 1
            i += 1
        if i < len(rest):
            out += _unwrap(rest[i:], problems, depth + 1)
        if cmd == "xargs":
            problems.append("`xargs` runs a command on arguments this check cannot see")
    elif cmd == "find":
        for flag in ("-exec", "-execdir", "-ok", "-okdir"):
            if flag in rest:
                i = rest.index(flag) + 1
                j = next((k for k in range(i, len(rest)) if rest[k] in (";", "+")), len(rest))
                out += _unwrap([a for a in rest[i:j] if a != "{}"], problems, depth + 1)
    elif cmd == "git":
        for a in rest:
            if a in ("-c", "--exec-path") or a.startswith(("--config-env", "--exec-path=")):
                problems.append("`git -c` sets configuration (a pager, an editor, a hook) for this command")
                break
            if not a.startswith("-"):
                break
    return out


def _numberish(s: str) -> bool:
    return bool(re.fullmatch(r"[+-]?\d+(\.\d+)?[smhd]?", s))


def _name(argv: list[str]) -> str:
    """`git log` for git commands (global options skipped), else the program's name."""
    if not argv:
        return ""
    cmd = os.path.basename(argv[0])
    if cmd == "git":
        rest = argv[1:]
        i = 0
        while i < len(rest) and rest[i].startswith("-"):
            i += 2 if rest[i] in ("-C", "-c", "--git-dir", "--work-tree", "--namespace") else 1
        return f"git {rest[i]}" if i < len(rest) else "git"
    return cmd


def _is_read_only(argv: list[str]) -> bool:
    if not argv or "/" in argv[0]:
        return False  # `./cat`, `bin/git`: a program from the repository, whatever its name
    name = _name(argv)
    if name not in READ_ONLY_COMMANDS:
        return False
    bad = UNSAFE_FLAGS.get(os.path.basename(argv[0]), ())
    for a in argv[1:]:
        if any(a == f or a.startswith(f + "=") or (f.startswith("--") and a.startswith(f)) for f in bad):
            return False
        if os.path.basename(argv[0]) == "git" and a in ("-C",):
            return False
    return True


def _path_args(c: SimpleCommand) -> list[tuple[str, bool, bool]]:
    """(text, is glob, tilde) of the words that may name files: everything after the program but options
    (an option's `=value` counts), the pattern of grep/rg, and the arguments of commands that take none."""
    argv = c.argv
    if not argv or os.path.basename(argv[0]) in NO_PATH_ARGS:
        return []
    name = _name(argv)
    words = c.words[1:]
    if name.startswith("git") and "--no-index" not in argv:
        # option values that name files, and every operand: a revision (`main`, `HEAD~1`, `origin/x`) resolves
        # inside the repository, while a path outside it makes `git diff` compare files with --no-index on its own
        # (`git diff /etc/passwd /dev/null` prints the file)
        out = []
        for i, w in enumerate(words):
            if i and words[i - 1].text in ("-C", "--output", "-o", "--contents", "--git-dir", "--work-tree"):
                out.append((w.text, w.glob, w.tilde))
            elif w.text.startswith("--") and "=" in w.text:
                out.append((w.text.split("=", 1)[1], w.glob, False))
            elif i and not w.text.startswith("-") and w.text != name.split()[-1] and w.text not in HARMLESS_TARGETS:
                out.append((w.text, w.glob, w.tilde))
        return out
    out = []
    skip_pattern = name in ("grep", "rg") and not any(w.text in ("-e", "-f", "--regexp", "--file") for w in words)
    for w in words:
        t = w.text
        if t.startswith("-"):
            if "=" in t:
                out.append((t.split("=", 1)[1], w.glob, False))
            elif not t.startswith("--") and len(t) > 2 and ("/" in t or t[2:].startswith("~")):
                out.append((t[2:], w.glob, t[2:].startswith("~")))  # a short option's value: `file -f/etc/x`
            continue
        if skip_pattern:
            skip_pattern = False
            continue
        out.append((t, w.glob, w.tilde))
    return out


def analyze(command: str, env: Any = None) -> Analysis:
    p = parse(command)
    problems = list(p.problems)
    commands, writes, outside, not_ro = [], [], [], []
    cwd = Path(env.cwd) if env is not None else None
    programs = None  # what the repository's git config runs, looked up once for the line's first git command
    for c in p.commands:
        argv = c.argv
        commands += _unwrap(argv, problems)
        if argv and not _is_read_only(argv):
            not_ro.append(_name(argv))
        elif argv and _name(argv).startswith("git") and env is not None:
            programs = repository_programs(Path(env.root)) if programs is None else programs
            if programs:  # `git status` would run them: not a command that only looks
                not_ro.append(f"{_name(argv)} (the repository's git config runs {', '.join(programs[:3])})")
        if _name(argv).startswith("git") and any(x == "--output" or x.startswith("--output=") for x in argv):
            writes.append(next(x for x in argv if x.startswith("--output")))
        for r in c.redirects:
            if r.writes:
                writes.append(r.target)
            if (
                r.reads
                and env is not None
                and r.target not in HARMLESS_TARGETS
                and not _inside(r.target, False, False, cwd, env)
            ):
                outside.append(r.target)
        if env is not None and cwd is not None:
            for text, is_glob, tilde in _path_args(c):
                if not _inside(text, is_glob, tilde, cwd, env):
                    outside.append(text)
            if argv and argv[0] == "cd":  # later parts run in the new folder; bare `cd` goes home
                operands = [a for a in argv[1:] if not a.startswith("-") or a == "-"]
                target = operands[0] if operands else "~"
                if target == "-" or not _inside(target, False, target.startswith("~"), cwd, env):
                    outside += [] if target in outside else [target]  # `cd -`: a folder we cannot know
                else:
                    cwd = Path(os.path.realpath(cwd / os.path.expanduser(target)))
    return Analysis(p, commands, [c.argv for c in p.commands], problems, writes, outside, not_ro, programs or [])


def _inside(text: str, is_glob: bool, tilde: bool, cwd: Path, env: Any) -> bool:
    if not text:
        return True
    t = os.path.expanduser(text) if tilde else text
    base = Path(t) if os.path.isabs(t) else cwd / t
    candidates = [Path(m) for m in globlib.glob(str(base))] if is_glob else []
    # as the kernel resolves it: `docs/..` is the parent of where the link `docs` points, not the repository
    candidates.append(Path(base))
    return all(env.is_allowed(c) for c in candidates)


def is_read_only(command: str, env: Any = None) -> bool:
    """Every part is on READ_ONLY_COMMANDS, nothing is substituted, expanded or redirected into a file, and (with
    `env`) no path argument leaves the repository."""
    a = analyze(command, env)
    return bool(a.top) and not (a.problems or a.writes or a.outside or a.not_read_only)
