"""Permissions: may this tool call run, must the user be asked, or is it refused?

Modes set the baseline:
    ask           (default) reads run; edits and commands not on the read-only allowlist ask first
    accept-edits  edits run too; commands still ask
    plan          read-only: edits refused, only read-only commands run
    auto          nothing asks (deny rules and the path fence still hold)
Rules refine it, written `tool` or `tool(specifier)`: for bash the specifier is a command prefix
(`bash(git push)`, `bash(npm run:*)`), for file tools a glob on the path relative to the repository
(`edit(src/**)`); tool names may be globs (`mcp__github__*`). Precedence: deny > ask > allow > mode.
A compound command (`a && b; c | d`) is allowed by a rule only when every part is, and denied when any part is.
Paths outside the repository are refused unless listed in `additional_dirs`; `.git/` and `.glm5/` are never
edited by the file tools.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from agent.tools.base import EDIT, EXECUTE, READ

ALLOW, ASK, DENY = "allow", "ask", "deny"

# Commands that only look: they run without asking in `ask` and `plan` modes.
READ_ONLY_COMMANDS = (
    "ls", "pwd", "cat", "head", "tail", "wc", "echo", "grep", "rg", "which", "file", "stat", "tree", "du",
    "git status", "git diff", "git log", "git show", "git blame", "git rev-parse", "git ls-files",
)  # fmt: skip
# Top-level folders the edit tools never touch, in any mode: git's data, and glm5's settings (an agent that could
# edit its own permission rules would have none).
PROTECTED = (".git", ".glm5")
_SPLIT = re.compile(r"&&|\|\||;|\||&|\n")
# Redirections, substitutions, and the few flags that make a "looking" command write or run something.
_UNSAFE = ("$(", "`", ">", "<(", "--output", "--pre", " -o ")


@dataclass(frozen=True)
class Rule:
    tool: str
    specifier: str | None = None

    @classmethod
    def parse(cls, text: str) -> Rule:
        m = re.fullmatch(r"\s*([A-Za-z0-9_\-\*\?]+)\s*(?:\((.*)\))?\s*", text)
        if not m:
            raise ValueError(f"bad permission rule {text!r}: write `tool` or `tool(specifier)`")
        spec = m.group(2)
        return cls(m.group(1), spec.strip() if spec is not None and spec.strip() else None)

    def matches_tool(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.tool)

    def matches_command(self, command: str) -> bool:
        if self.specifier is None:
            return True
        prefix = self.specifier.removesuffix(":*").removesuffix("*").rstrip()
        return (
            command == prefix
            or command.startswith(prefix + " ")
            or (self.specifier.endswith("*") and command.startswith(prefix))
        )

    def matches_path(self, rel: str) -> bool:
        return self.specifier is None or fnmatch.fnmatch(rel, self.specifier)


_FD_DUP = re.compile(r"\d*>&\d+")  # 2>&1: joins streams, writes nothing


def split_command(command: str) -> list[str]:
    return [p.strip() for p in _SPLIT.split(_FD_DUP.sub(" ", command)) if p.strip()]


def is_read_only(command: str) -> bool:
    """Every part of the command is on READ_ONLY_COMMANDS and nothing redirects or substitutes."""
    if any(u in _FD_DUP.sub(" ", command) for u in _UNSAFE):
        return False
    parts = split_command(command)
    return bool(parts) and all(any(Rule("bash", c).matches_command(p) for c in READ_ONLY_COMMANDS) for p in parts)


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

    def _match(self, rules: list[Rule], name: str, kind: str, subject: str | None, rel: str | None, every: bool):
        for r in rules:
            if not r.matches_tool(name):
                continue
            if kind == EXECUTE and subject is not None and r.specifier is not None:
                parts = split_command(subject) or [subject]
                hit = all(r.matches_command(p) for p in parts) if every else any(r.matches_command(p) for p in parts)
                if hit:
                    return r
            elif rel is not None and r.specifier is not None:
                if r.matches_path(rel):
                    return r
            elif r.specifier is None:
                return r
        return None

    def check(self, name: str, kind: str, subject: str | None, env: Any = None) -> Decision:
        rel = None
        if kind in (READ, EDIT) and subject is not None and env is not None:
            path = env.resolve(subject)
            if not env.is_allowed(path):
                return Decision(DENY, f"{path} is outside the repository (allow it with permissions.additional_dirs)")
            rel = env.display(path)
            if kind == EDIT and rel.split("/", 1)[0] in PROTECTED:
                return Decision(DENY, f"{rel} is protected: the agent does not edit git's data or its own settings")
        if r := self._match(self.deny, name, kind, subject, rel, every=False):
            return Decision(DENY, f"denied by rule {_fmt(r)}")
        if self.mode == "plan":
            if kind == EDIT:
                return Decision(DENY, "plan mode is read-only: no edits")
            if kind == EXECUTE and not (subject and is_read_only(subject)):
                return Decision(DENY, "plan mode is read-only: only read-only commands run")
        if r := self._match(self.ask, name, kind, subject, rel, every=False):
            return Decision(ALLOW if self.mode == "auto" else ASK, f"rule {_fmt(r)}")
        if r := self._match(self.allow, name, kind, subject, rel, every=True):
            return Decision(ALLOW, f"allowed by rule {_fmt(r)}")
        if kind == READ or (kind not in (EDIT, EXECUTE) and name == "todo"):
            return Decision(ALLOW, "reads are allowed")
        if kind == EXECUTE and subject and is_read_only(subject):
            return Decision(ALLOW, "read-only command")
        if self.mode == "auto":
            return Decision(ALLOW, "auto mode")
        if kind == EDIT and self.mode == "accept-edits":
            return Decision(ALLOW, "accept-edits mode")
        return Decision(ASK, f"{self.mode} mode asks before {'edits' if kind == EDIT else 'running ' + name}")

    def add_allow(self, rule: str) -> None:
        self.allow.append(Rule.parse(rule))


def _fmt(r: Rule) -> str:
    return r.tool if r.specifier is None else f"{r.tool}({r.specifier})"


def suggest_rule(name: str, kind: str, subject: str | None) -> str:
    """The rule an "always allow" answer adds: the command's first word(s), or the tool."""
    if kind == EXECUTE and subject:
        words = split_command(subject)[0].split()
        prefix = " ".join(words[:2]) if words and words[0] in ("git", "npm", "cargo", "uv", "go", "make") else words[0]
        return f"{name}({prefix})"
    return name
