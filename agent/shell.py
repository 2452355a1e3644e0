"""A conservative parser of bash command lines, for permission decisions (not for running anything).

Permission rules must judge what bash will actually run, not the text's prefix: `git log $(rm -rf ~)` is not
`git log`. `parse()` splits a line into simple commands at `;`, `&&`, `||`, `|`, `|&`, `&` and newlines, removes
quotes the way bash does, and records every construct whose effect it cannot see statically as a *problem*
(command and process substitution, parameter expansion, brace expansion, subshells and control structures,
here-documents that expand, environment-variable prefixes, unparsable quoting). A caller treats a problem as
"ask the user"; only a line without problems is ever matched against allow rules or the read-only allowlist.

Redirections are kept per command (`> file` writes, `< file` reads; duplicating descriptors like `2>&1` and
writing to /dev/null are harmless). Words that bash would glob-expand are kept as patterns and flagged, so path
checks can expand them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

OPERATORS = ("&&", "||", "|&", ";;", "|", ";", "&", "\n")
KEYWORDS = {
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac", "function",
    "select", "coproc", "[[", "]]", "{", "}", "!",
}  # fmt: skip
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_REDIR = re.compile(r"(\d+|\{[A-Za-z_][A-Za-z0-9_]*\})?(&>>|&>|>>|>\||>&|<<<|<<-|<<|<&|<>|>|<)")
HARMLESS_TARGETS = {"/dev/null", "/dev/stdout", "/dev/stderr"}


@dataclass
class Word:
    text: str  # after quote removal
    glob: bool = False  # holds an unquoted *, ? or [ that bash would expand against the filesystem
    tilde: bool = False  # begins with an unquoted ~ (expanded to a home folder)


@dataclass
class Redirect:
    op: str  # >, >>, <, <>, &>, ... (with its descriptor prefix removed)
    target: str  # the file, or the descriptor for >& / <&
    fd: str = ""

    @property
    def writes(self) -> bool:
        if self.op in ("<", "<<", "<<-", "<<<"):
            return False
        if self.op in (">&", "<&") and (self.target.isdigit() or self.target == "-"):
            return False
        return self.target not in HARMLESS_TARGETS

    @property
    def reads(self) -> bool:
        return self.op in ("<", "<>")


@dataclass
class SimpleCommand:
    words: list[Word] = field(default_factory=list)
    assignments: list[str] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        return [w.text for w in self.words]

    def __str__(self) -> str:
        return shlex.join(self.argv)


@dataclass
class Parsed:
    commands: list[SimpleCommand]
    operators: list[str]
    problems: list[str]  # why this line cannot be judged statically; empty when it can

    @property
    def ok(self) -> bool:
        return not self.problems


class _Lexer:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.problems: list[str] = []

    def problem(self, why: str) -> None:
        if why not in self.problems:
            self.problems.append(why)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def skip_blanks(self) -> None:
        while self.peek() in (" ", "\t") and self.peek() != "":
            self.i += 1
        if self.peek() == "\\" and self.peek(1) == "\n":  # line continuation between words
            self.i += 2
            self.skip_blanks()

    def operator(self) -> str | None:
        for op in OPERATORS:
            if self.s.startswith(op, self.i):
                return op
        return None

    def dollar(self, quoted: bool) -> str:
        """At a `$`: returns the literal text it stands for when static, else records a problem."""
        nxt = self.peek(1)
        if nxt == "(":
            self.problem("command substitution $(...)" if self.peek(2) != "(" else "arithmetic expansion $((...))")
            self._skip_balanced("(", ")")
            return ""
        if nxt == "{":
            self.problem("parameter expansion ${...}")
            self._skip_balanced("{", "}")
            return ""
        if nxt == "'" and not quoted:
            self.problem("ANSI-C quoting $'...'")
            self.i += 2
            while self.i < len(self.s) and self.peek() != "'":
                self.i += 2 if self.peek() == "\\" else 1
            self.i += 1
            return ""
        if nxt == '"' and not quoted:  # $"..." is a translated string: as "..."
            self.i += 1
            return ""
        if nxt and (nxt.isalnum() or nxt in "_@*#?$!-"):
            self.problem("variable expansion $" + nxt)
            self.i += 2
            if nxt.isalpha() or nxt == "_":
                while self.peek() and (self.peek().isalnum() or self.peek() == "_"):
                    self.i += 1
            return ""
        self.i += 1
        return "$"

    def _skip_balanced(self, open_: str, close: str) -> None:
        depth = 0
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\":
                self.i += 2
                continue
            if c == "'" and open_ == "(":
                end = self.s.find("'", self.i + 1)
                self.i = len(self.s) if end < 0 else end + 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            self.i += 1
        self.problem("unterminated " + open_)

    def word(self) -> Word | None:
        """The next word (quotes removed), or None at an operator or the end."""
        start = self.i
        out: list[str] = []
        glob = tilde = False
        if self.peek() == "~":
            tilde = True
        if self.peek() == "#":  # a comment runs to the end of the line
            end = self.s.find("\n", self.i)
            self.i = len(self.s) if end < 0 else end
            return None
        while self.i < len(self.s):
            c = self.peek()
            if c in (" ", "\t", "\n") or c in ";&|()<>":
                if c in "<>" and self.peek(1) == "(":
                    self.problem("process substitution")
                    self.i += 1
                    self._skip_balanced("(", ")")
                    continue
                if c in "()":
                    self.problem("subshell or function ( )")
                    self.i += 1
                    continue
                break
            if c == "\\":
                if self.peek(1) == "\n":
                    self.i += 2
                    continue
                out.append(self.peek(1) or "\\")  # a trailing backslash stays literal
                self.i += 2
                continue
            if c == "'":
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    self.problem("unterminated single quote")
                    self.i = len(self.s)
                    break
                out.append(self.s[self.i + 1 : end])
                self.i = end + 1
                continue
            if c == '"':
                self._double_quoted(out)
                continue
            if c == "$":
                out.append(self.dollar(quoted=False))
                continue
            if c == "`":
                self._backticks()
                continue
            if c in "*?[":
                glob = True
            if c == "{" and re.match(r"\{[^{}\s]*(,|\.\.)[^{}\s]*\}", self.s[self.i :]):
                self.problem("brace expansion {a,b}")
            if c in "!" and self.peek(1) not in ("", " ", "\t", "=", "\n"):
                self.problem("history expansion !")  # only interactive shells expand it; ask anyway
            out.append(c)
            self.i += 1
        if self.i == start:
            return None
        return Word("".join(out), glob=glob, tilde=tilde)

    def _double_quoted(self, out: list[str]) -> None:
        """A "..." string from its opening quote: its text onto `out`, `$` expansions and backticks noted."""
        self.i += 1
        while True:
            d = self.peek()
            if d == "":
                self.problem("unterminated double quote")
                break
            if d == '"':
                self.i += 1
                break
            if d == "\\" and self.peek(1) in ('"', "\\", "$", "`", "\n"):
                if self.peek(1) != "\n":
                    out.append(self.peek(1))
                self.i += 2
            elif d == "$":
                out.append(self.dollar(quoted=True))
            elif d == "`":
                self._backticks()
            else:
                out.append(d)
                self.i += 1

    def _backticks(self) -> None:
        """A `...` command substitution, skipped and noted as a problem."""
        self.problem("command substitution `...`")
        end = self.s.find("`", self.i + 1)
        self.i = len(self.s) if end < 0 else end + 1


def parse(line: str) -> Parsed:
    """Split `line` into simple commands and record what cannot be judged statically."""
    lx = _Lexer(line)
    commands: list[SimpleCommand] = []
    operators: list[str] = []
    cur = SimpleCommand()
    heredocs: list[tuple[str, bool]] = []  # (delimiter, body expands)

    def end_command() -> None:
        nonlocal cur
        if cur.words or cur.assignments or cur.redirects:
            commands.append(cur)
        cur = SimpleCommand()

    while True:
        lx.skip_blanks()
        if lx.i >= len(lx.s):
            break
        m = _REDIR.match(lx.s, lx.i)
        if m and (m.group(1) is None or lx.i == 0 or lx.s[lx.i - 1] in " \t;&|\n"):
            if m.group(1) and m.group(1).startswith("{"):
                lx.problem("named descriptor redirection {var}>")
            op = m.group(2)
            if lx.s.startswith("(", m.end()):  # <( ) >( ) after a descriptor-less redirect token
                lx.i = m.end() - 1
                w = lx.word()
                continue
            lx.i = m.end()
            lx.skip_blanks()
            w = lx.word()
            if w is None:
                lx.problem(f"redirection {op} without a target")
                continue
            if op in ("<<", "<<-"):
                raw = lx.s[lx.i - len(w.text) - 2 : lx.i]
                heredocs.append((w.text, not any(q in raw for q in "'\"\\")))
            elif w.glob or w.tilde:
                lx.problem(f"redirection target {w.text!r} is expanded by the shell")
            cur.redirects.append(Redirect(op=op, target=w.text, fd=m.group(1) or ""))
            continue
        op = lx.operator()
        if op is not None:
            lx.i += len(op)
            if op == ";;":
                lx.problem("case statement")
            if op == "&":
                lx.problem("background job &")
            if op != "\n" and not (cur.words or cur.assignments or cur.redirects):
                lx.problem(f"syntax error: {op!r} without a command before it")
            end_command()
            if op == "\n" and heredocs:
                _read_heredocs(lx, heredocs)
                heredocs.clear()
            if op != "\n" or (operators and operators[-1] != "\n"):
                operators.append(op)
            continue
        w = lx.word()
        if w is None:
            if lx.i < len(lx.s) and lx.peek() not in ("\n",):
                lx.problem(f"cannot parse near {lx.s[lx.i : lx.i + 10]!r}")
                break
            continue
        if not cur.words and _ASSIGN.match(w.text) and not w.text.startswith("="):
            cur.assignments.append(w.text)
            lx.problem("environment variable prefix or assignment " + w.text.split("=", 1)[0])
            continue
        if not cur.words and w.text in KEYWORDS:
            lx.problem(f"shell keyword {w.text!r} (control structure or group)")
        cur.words.append(w)
    if operators and operators[-1] in ("&&", "||", "|", "|&") and not (cur.words or cur.redirects):
        lx.problem(f"syntax error: the line ends with {operators[-1]!r}")
    end_command()
    if heredocs:
        lx.problem("here-document without its body")
    while operators and operators[-1] == "\n":
        operators.pop()
    return Parsed(commands, operators, lx.problems)


def _read_heredocs(lx: _Lexer, heredocs: list[tuple[str, bool]]) -> None:
    """Consume here-document bodies (they are input, not commands); an expanding body is a problem only when it
    holds an expansion."""
    for delim, expands in heredocs:
        while lx.i <= len(lx.s):
            end = lx.s.find("\n", lx.i)
            line = lx.s[lx.i :] if end < 0 else lx.s[lx.i : end]
            lx.i = len(lx.s) if end < 0 else end + 1
            if line.lstrip("\t") == delim:
                break
            if expands and ("$" in line or "`" in line):
                lx.problem("here-document with expansions")
            if end < 0:
                lx.problem("here-document without its end line")
                break
