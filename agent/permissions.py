"""Permissions: may this tool call run, must the user be asked, or is it refused?

Modes set the baseline:
    ask           (default) reads run; edits and commands not on the read-only allowlist ask first
    accept-edits  edits run too; commands still ask
    plan          read-only: edits refused, only read-only commands run
    auto          nothing asks (deny rules and the path fence still hold)
Rules refine it, written `tool` or `tool(specifier)`: for bash the specifier is a command whose words must begin
the command's words (`bash(git push)`, `bash(npm run:*)`; a compound specifier matches only that exact line),
for file tools a glob on the path relative to the repository (`edit(src/**)`); tool names may be globs
(`mcp__github__*`). Precedence: deny > ask > allow > mode.

Commands are judged on what bash will run (agent/shell.py), never on the text's prefix: a line is split into
simple commands at `;`, `&&`, `||`, `|`, `&`, and every one must be allowed on its own; wrappers (`timeout`,
`nice`, `xargs`, `find -exec`, `sh -c '...'`) are looked through for deny rules. What cannot be judged
statically (substitutions, expansions, env-variable prefixes, `eval`, `exec`, `sh -c`, `sudo`, `git -c`) asks;
a redirection that writes a file asks; a path argument that resolves (links followed) outside the repository
asks, in every mode but auto. Paths outside the repository are refused to the file tools unless listed in
`additional_dirs`; `.git/` and `.glm5/` are never edited by the file tools.
"""

from __future__ import annotations

import fnmatch
import glob as globlib
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.shell import HARMLESS_TARGETS, Parsed, SimpleCommand, parse
from agent.tools.base import EDIT, EXECUTE, READ

ALLOW, ASK, DENY = "allow", "ask", "deny"

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
# Top-level folders the edit tools never touch, in any mode: git's data, and glm5's settings (an agent that could
# edit its own permission rules would have none).
PROTECTED = (".git", ".glm5")


@dataclass(frozen=True)
class Rule:
    tool: str
    specifier: str | None = None

    @classmethod
    def parse(cls, text: str) -> Rule:
        m = re.fullmatch(r"\s*([A-Za-z0-9_\-\*\?]+)\s*(?:\((.*)\))?\s*", text, re.S)
        if not m:
            raise ValueError(f"bad permission rule {text!r}: write `tool` or `tool(specifier)`")
        spec = m.group(2)
        return cls(m.group(1), spec.strip() if spec is not None and spec.strip() else None)

    def matches_tool(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.tool)

    def _words(self) -> tuple[list[str], bool] | None:
        """The specifier's words and whether its last word is a string prefix (`git*`); None when it is a
        compound line (matched as exact text only)."""
        spec = (self.specifier or "").removesuffix(":*").rstrip()
        star = spec.endswith("*") and not spec.endswith(" *")
        spec = spec.removesuffix("*").rstrip()
        p = parse(spec)
        if len(p.commands) != 1 or p.problems or p.commands[0].redirects or p.commands[0].assignments:
            return None
        return p.commands[0].argv, star

    def matches_argv(self, argv: list[str], allowing: bool = False) -> bool:
        """The rule's words begin argv's. When allowing, a destructive program's rule without `:*` (what "always
        allow" stores for `rm -rf build`) matches that exact command only, not `rm -rf build ~`."""
        if self.specifier is None:
            return True
        w = self._words()
        if w is None or not w[0]:
            return False
        words, star = w
        exact = allowing and not self.specifier.endswith("*") and os.path.basename(words[0]) in _EXACT_ONLY
        if exact and len(argv) != len(words):
            return False
        if len(argv) < len(words) or argv[: len(words) - 1] != words[:-1]:
            return False
        last = argv[len(words) - 1]
        return last.startswith(words[-1]) if star else last == words[-1]

    def matches_exact(self, command: str) -> bool:
        return self.specifier is not None and _normal(self.specifier) == _normal(command)

    def matches_command(self, command: str) -> bool:
        """A single command line (kept for callers that match text): exact, or every part matches."""
        if self.matches_exact(command):
            return True
        p = parse(command)
        return bool(p.commands) and all(self.matches_argv(c.argv) for c in p.commands)

    def matches_path(self, rel: str) -> bool:
        return self.specifier is None or fnmatch.fnmatch(rel, self.specifier)


def _normal(command: str) -> str:
    """Runs of spaces and tabs as one space, the ends stripped; a newline stays: it separates two commands (an exact
    rule for `chmod +x ./run.sh` must not allow `chmod +x` then `./run.sh`)."""
    return re.sub(r"[ \t]+", " ", command.strip(" \t\n"))


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
            from agent.git_safe import repository_programs

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


@dataclass(frozen=True)
class Decision:
    action: str  # ALLOW | ASK | DENY
    reason: str


@dataclass
class Permissions:
    mode: str = "ask"
    allow: list[Rule] = field(default_factory=list)
    ask: list[Rule] = field(default_factory=list)
    deny: list[Rule] = field(default_factory=list)

    @classmethod
    def from_settings(cls, settings: Any) -> Permissions:
        return cls(
            mode=settings.mode,
            allow=[Rule.parse(r) for r in settings.allow],
            ask=[Rule.parse(r) for r in settings.ask],
            deny=[Rule.parse(r) for r in settings.deny],
        )

    def _match_path(self, rules: list[Rule], name: str, rel: str | None) -> Rule | None:
        for r in rules:
            if r.matches_tool(name) and (r.specifier is None or (rel is not None and r.matches_path(rel))):
                return r
        return None

    def _match_command(self, rules: list[Rule], name: str, a: Analysis, command: str, every: bool) -> Rule | None:
        for r in rules:
            if not r.matches_tool(name):
                continue
            if r.specifier is None or r.matches_exact(command):
                return r
            argvs = a.top if every else a.commands
            if every:
                if argvs and all(r.matches_argv(v, allowing=True) for v in argvs):
                    return r
            elif any(r.matches_argv(v) for v in argvs):
                return r
        return None

    def check(self, name: str, kind: str, subject: str | None, env: Any = None) -> Decision:
        if kind == EXECUTE and isinstance(subject, str):
            return self._check_command(name, subject, env)
        rel = None
        if kind in (READ, EDIT) and subject is not None and env is not None:
            path = env.resolve(subject)
            if not env.is_allowed(path):
                return Decision(DENY, f"{path} is outside the repository (allow it with permissions.additional_dirs)")
            rel = env.display(Path(os.path.realpath(path)))
            if kind == EDIT and (rel.split("/", 1)[0] in PROTECTED or _protected_real(path, env)):
                return Decision(DENY, f"{rel} is protected: the agent does not edit git's data or its own settings")
        if r := self._match_path(self.deny, name, rel):
            return Decision(DENY, f"denied by rule {_fmt(r)}")
        if self.mode == "plan" and kind == EDIT:
            return Decision(DENY, "plan mode is read-only: no edits")
        if r := self._match_path(self.ask, name, rel):
            return Decision(ALLOW if self.mode == "auto" else ASK, f"rule {_fmt(r)}")
        if r := self._match_path(self.allow, name, rel):
            return Decision(ALLOW, f"allowed by rule {_fmt(r)}")
        if kind == READ or (kind not in (EDIT, EXECUTE) and name == "todo"):
            return Decision(ALLOW, "reads are allowed")
        if self.mode == "plan" and kind == EXECUTE:
            return Decision(DENY, "plan mode is read-only: only read-only commands run")
        if self.mode == "auto":
            return Decision(ALLOW, "auto mode")
        if kind == EDIT and self.mode == "accept-edits":
            return Decision(ALLOW, "accept-edits mode")
        return Decision(ASK, f"{self.mode} mode asks before {'edits' if kind == EDIT else 'running ' + name}")

    def _check_command(self, name: str, command: str, env: Any) -> Decision:
        a = analyze(command, env)
        if r := self._match_command(self.deny, name, a, command, every=False):
            return Decision(DENY, f"denied by rule {_fmt(r)}")
        # What static reading cannot see through could hide a denied command: with deny rules for this tool,
        # even auto mode asks.
        opaque = a.problems and any(r.matches_tool(name) and r.specifier for r in self.deny)
        read_only = bool(a.top) and not (a.problems or a.writes or a.outside or a.not_read_only)
        if self.mode == "plan":
            if a.outside and not (a.problems or a.writes or a.not_read_only):
                return Decision(ASK, f"reads outside the repository: {', '.join(a.outside[:3])}")
            if not read_only:
                why = f" (the repository's git config runs {_git_why(a)})" if a.git_programs else ""
                return Decision(DENY, f"plan mode is read-only: only read-only commands run{why}")
        if r := self._match_command(self.ask, name, a, command, every=False):
            return Decision(ALLOW if self.mode == "auto" and not opaque else ASK, f"rule {_fmt(r)}")
        if self.mode == "auto":
            if opaque:
                return Decision(ASK, f"cannot check against the deny rules: {a.problems[0]}")
            return Decision(ALLOW, "auto mode")
        exact = next((r for r in self.allow if r.matches_tool(name) and r.matches_exact(command)), None)
        if exact is not None:
            return Decision(ALLOW, f"allowed by rule {_fmt(exact)}")
        if a.problems:
            return Decision(ASK, f"needs a look: {a.problems[0]}")
        if a.writes:
            return Decision(ASK, f"writes {', '.join(a.writes[:3])}")
        if a.outside:
            return Decision(ASK, f"reads outside the repository: {', '.join(a.outside[:3])}")
        if r := self._match_command(self.allow, name, a, command, every=True):
            return Decision(ALLOW, f"allowed by rule {_fmt(r)}")
        if read_only:
            return Decision(ALLOW, "read-only command")
        # Each part allowed by a rule or read-only on its own.
        if a.top and all(
            a.looks_only(v)
            or any(r.matches_tool(name) and r.matches_argv(v, allowing=True) for r in self.allow if r.specifier)
            for v in a.top
        ):
            return Decision(ALLOW, "every part is allowed")
        if a.git_programs:
            return Decision(ASK, f"the repository's git config runs programs when git reads it: {_git_why(a)}")
        return Decision(ASK, f"{self.mode} mode asks before running {name}")

    def add_allow(self, rule: str) -> None:
        self.allow.append(Rule.parse(rule))


def _protected_real(path: Path, env: Any) -> bool:
    """A link in the repository pointing into `.git` or `.glm5` (`gitdir -> .git`) is protected too."""
    real = Path(os.path.realpath(path))
    return any(real == env.root / p or (env.root / p) in real.parents for p in PROTECTED)


def _git_why(a: Analysis) -> str:
    return ", ".join(a.git_programs[:3]) + (" ..." if len(a.git_programs) > 3 else "")


def _fmt(r: Rule) -> str:
    return r.tool if r.specifier is None else f"{r.tool}({r.specifier})"


# Programs whose first argument names what runs (a subcommand): the rule keeps it.
_SUBCOMMANDS = ("git", "npm", "pnpm", "yarn", "cargo", "go", "make", "pip", "pip3", "docker", "kubectl", "poetry",
                "uv", "conda", "dotnet", "mvn", "gradle", "bundle", "rake")  # fmt: skip
_RUNNERS = {("npm", "run"), ("pnpm", "run"), ("yarn", "run"), ("uv", "run"), ("poetry", "run"), ("bundle", "exec")}
_INTERPRETERS = ("python", "python3", "node", "ruby", "perl", "php", "deno", "bun")
# Programs an always-allow should never cover beyond the exact line.
_EXACT_ONLY = ("rm", "mv", "cp", "dd", "chmod", "chown", "curl", "wget", "ssh", "scp", "kill", "pkill", "killall",
               "shred", "truncate", "ln", "tee", "mkfs", "mount", "rsync")  # fmt: skip


def narrowest_rule(command: str) -> str:
    """The narrowest rule an "always allow" of `command` should propose (the user may edit it):
    `python -m pytest -q` -> `bash(python -m pytest:*)`, `npm run build` -> `bash(npm run build:*)`,
    `git commit -m x` -> `bash(git commit:*)`; a compound line, one with expansions or redirections, or a
    destructive program gets the exact line."""
    p = parse(command)
    exact = f"bash({_normal(command)})"
    if len(p.commands) != 1 or p.problems or p.commands[0].redirects:
        return exact
    argv = p.commands[0].argv
    if not argv:
        return exact
    cmd = os.path.basename(argv[0])
    if cmd in _EXACT_ONLY or cmd in OPAQUE or cmd in SHELLS or cmd in WRAPPERS:
        return exact
    keep = 1
    if re.fullmatch(r"(python|python3(\.\d+)?|pypy3?)", cmd) or cmd in _INTERPRETERS:
        if len(argv) > 2 and argv[1] == "-m":
            keep = 3
        elif len(argv) > 1 and not argv[1].startswith("-"):
            keep = 2  # the script
        else:
            return exact  # `python -c ...`, a bare interpreter
    elif cmd in _SUBCOMMANDS and len(argv) > 1 and not argv[1].startswith("-"):
        keep = 3 if (cmd, argv[1]) in _RUNNERS and len(argv) > 2 else 2
    if keep >= len(argv) and keep > 1:
        return f"bash({shlex.join(argv)})"
    return f"bash({shlex.join(argv[:keep])}:*)"


def suggest_rule(name: str, kind: str, subject: str | None) -> str:
    """The rule an "always allow" answer proposes: the narrowest for a command, else the tool."""
    if kind == EXECUTE and subject and name == "bash":
        return narrowest_rule(subject)
    if kind == EXECUTE and subject:
        return f"{name}({_normal(subject)})"
    return name
