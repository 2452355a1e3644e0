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

Commands are judged on what bash will run (agent/command_analysis.py over agent/shell.py), never on the text's
prefix: a line is split into simple commands at `;`, `&&`, `||`, `|`, `&`, and every one must be allowed on its
own; wrappers (`timeout`, `nice`, `xargs`, `find -exec`, `sh -c '...'`) are looked through for deny rules. What
cannot be judged statically (substitutions, expansions, env-variable prefixes, `eval`, `exec`, `sh -c`, `sudo`, `git -c`) asks;
a redirection that writes a file asks; a path argument that resolves (links followed) outside the repository
asks, in every mode but auto. Paths outside the repository are refused to the file tools unless listed in
`additional_dirs`; `.git/` and `.glm5/` are never edited by the file tools.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.command_analysis import OPAQUE, SHELLS, WRAPPERS, Analysis, analyze
from agent.shell import parse
from agent.tools.base import EDIT, EXECUTE, READ

ALLOW, ASK, DENY = "allow", "ask", "deny"

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
