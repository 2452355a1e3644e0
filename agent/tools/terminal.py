"""The terminal tools: interactive programs in named pseudo-terminal sessions (agent/terminal.py).

    terminal_open(session, command?, cols?, rows?)          a shell (default) or `command`, in the sandbox
    terminal_send(session, input, wait_for?, timeout?, read?) keystrokes, then the screen once quiet / on a pattern
    terminal_read(session, read?, wait_for?, timeout?)      the screen, or the lines since the last read
    terminal_resize(session, cols, rows)
    terminal_close(session)

Permissions (`judge`, read by agent/approval.py): what a terminal would run is checked as the same `bash` command
would be, under the same rules. Opening a program is its command line (a bare shell runs nothing yet); a line sent
to a shell is that line, judged when Enter completes it. "A shell" is the terminal's foreground program as the
kernel reports it (the shell at its prompt, however it was started), or a job in cooked mode under a shell
session (what it does not read, the shell runs once it ends). At a shell only plain text, Enter, Backspace, Ctrl-C,
Ctrl-U, Ctrl-D and Ctrl-L are accepted: completion and history keys (Tab, arrows, Ctrl-R) make a line that cannot
be checked. Keystrokes to any other program (a REPL, an editor, a pager, a debugger) run inside the sandbox without
asking, except in plan mode. Between approval and sending, the terminal is looked at again: if what it would run
changed, nothing is sent. PreToolUse hooks that match `bash` also run for a line a shell will run, with
`{"command": line}` as a bash call's input (agent/tool_call.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

import regex

from agent.environment import CommandResult
from agent.terminal import KEYS, TerminalError, is_shell
from agent.tools.base import EXECUTE, READ, ToolContext, ToolError, ToolResult, require

# the prompt set here, not in the environment: the sandbox's rlimit wrapper is a non-interactive bash, which drops PS1
DEFAULT_SHELL = ["env", "PS1=$ ", "bash", "--noprofile", "--norc", "-i"]
MAX_WAIT_S = 600.0
# keys a shell's line editor takes without making the line unknowable
_SHELL_KEYS = {"Enter", "BSpace", "C-c", "C-u", "C-d", "C-l", "Space", "C-m", "C-j"}

SESSION = {"type": "string", "description": "Session name, e.g. main."}
WAIT_FOR = {"type": "string", "description": "Regex (multiline, lines right-stripped): return once it shows."}
TIMEOUT = {"type": "number", "description": "Max seconds to wait."}
READ_MODE = {"type": "string", "enum": ["screen", "new"], "description": "new: only lines since the last read."}


@dataclass(frozen=True)
class Judgement:
    """What a terminal call would run, for the permission rules: `subject` a command line (checked as `bash`
    would be), None when nothing would run; `refuse` a reason the call cannot be judged at all."""

    subject: str | None = None
    refuse: str | None = None
    reason: str = "keystrokes to a program inside the sandbox"
    preview: str = ""
    basis: tuple = ()  # what the judgement saw: compared again just before sending


def parse_input(value: Any) -> list[tuple[str, str]]:
    """`input` as [(kind, text)]: an item that is exactly `<Key>` is that key, anything else literal text."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ToolError("input must be a string or a list of strings")
    out = []
    for item in items:
        m = re.fullmatch(r"<([A-Za-z0-9\-\[\\\]_@]+)>", item)
        if m:
            key = m.group(1)
            if key not in KEYS:
                raise ToolError(f"unknown key <{key}>; keys: <Enter> <Tab> <Esc> <BSpace> <Up> <Down> <Left> "
                                "<Right> <Home> <End> <PageUp> <PageDown> <Delete> <F1>..<F12> <C-a>..<C-z>")
            out.append(("key", key))
        elif item:
            out.append(("text", item))
    return out


def encode(items: list[tuple[str, str]]) -> str:
    """What the program reads: text as typed (a newline is Enter), keys as xterm sends them."""
    return "".join(KEYS[v] if k == "key" else v.replace("\r\n", "\r").replace("\n", "\r") for k, v in items)


def shell_lines(typed: str, items: list[tuple[str, str]]) -> tuple[list[str], str, str | None]:
    """The lines a shell's line editor would run, given what is already typed at its prompt: (lines, what stays
    typed, why it cannot be judged)."""
    lines, cur = [], typed
    for kind, v in items:
        if kind == "key":
            if v not in _SHELL_KEYS:
                return [], typed, (f"<{v}> at a shell prompt makes a line that cannot be checked (completion, "
                                   "history, cursor movement); type the whole line as text")  # fmt: skip
            if v in ("Enter", "C-m", "C-j"):
                lines.append(cur)
                cur = ""
            elif v in ("C-c", "C-u"):
                cur = ""
            elif v == "BSpace":
                cur = cur[:-1]
            elif v == "C-d" and cur:
                return [], typed, "<C-d> in the middle of a line at a shell prompt cannot be checked"
            elif v == "Space":
                cur += " "
            continue
        for ch in v.replace("\r\n", "\n"):
            if ch in "\r\n":
                lines.append(cur)
                cur = ""
            elif ord(ch) < 32 or ch == "\x7f":
                return [], typed, (f"control character {ch!r} in text at a shell prompt: send keys as <Key> "
                                   "items; a tab would complete the line into one that cannot be checked")  # fmt: skip
            else:
                cur += ch
    return [ln for ln in lines if ln.strip()], cur, None


def _session_arg(args: dict[str, Any]) -> str:
    return require(args, "session")


def _timeout(args: dict[str, Any], default: float) -> float:
    t = args.get("timeout", default)
    if not isinstance(t, int | float) or isinstance(t, bool) or t < 0:
        raise ToolError("timeout must be a number of seconds (0 or more)")
    return min(float(t), MAX_WAIT_S)


def _read_mode(args: dict[str, Any], default: str) -> str:
    mode = args.get("read", default)
    if mode not in ("screen", "new"):
        raise ToolError("read must be `screen` or `new`")
    return mode


def _wait_and_read(session, args: dict[str, Any], default_timeout: float, default_read: str, env: Any) -> ToolResult:
    """Wait as `args` say, then read; long output is cut as `bash`'s is (head and tail, the whole in a file)."""
    pattern = args.get("wait_for")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise ToolError("wait_for must be a string (a regex)")
        try:
            regex.compile(pattern)  # what Session.wait searches with (agent/terminal.py)
        except regex.error as e:
            raise ToolError(f"wait_for is not a valid regex: {e}") from None
    timeout = _timeout(args, default_timeout)
    interrupt = getattr(env, "interrupt", None)
    first = bool(args.get("_first_output"))
    how = session.wait(pattern=pattern, timeout_s=timeout, interrupt=interrupt, first_output=first) \
        if (pattern or timeout > 0) else "now"  # fmt: skip
    text = session.read(_read_mode(args, default_read))
    if how == "timeout" and pattern:
        text += f"\n[wait_for {pattern!r} did not show within {timeout:g}s]"
    if how == "interrupted":
        text += "\n[the wait was interrupted by the user; the session still runs]"
    res = env.cut(CommandResult(text, 0)) if hasattr(env, "cut") else CommandResult(text, 0)
    data = {"session": session.name, "waited": how, "alive": session.alive, "full_output": res.full_output_path}
    return ToolResult(res.output, data=data)


class _TerminalTool:
    kind = EXECUTE

    def subject(self, args: dict[str, Any]) -> str | None:
        return None  # judged by `judge` (agent/approval.py), which sees the terminal's state

    def _terminals(self, ctx_env):
        return ctx_env.terminals


class TerminalOpenTool(_TerminalTool):
    name = "terminal_open"
    description = (
        "Open a named interactive terminal (a pty) running bash, or `command` (a REPL, a debugger, an editor, a "
        "server). It persists across calls. Returns its screen."
    )
    parameters = {
        "type": "object",
        "properties": {
            "session": SESSION,
            "command": {"type": "string", "description": "Program to run (default: bash)."},
            "cols": {"type": "integer", "description": "Default 120."},
            "rows": {"type": "integer", "description": "Default 32."},
        },
        "required": ["session"],
    }

    def judge(self, args: dict[str, Any], env: Any) -> Judgement:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            return Judgement(None, reason="an interactive shell (each line sent to it is checked)")
        try:
            argv = shlex.split(command)
        except ValueError:
            argv = []
        if len(argv) == 1 and is_shell(argv[0].rsplit("/", 1)[-1]):
            return Judgement(None, reason="an interactive shell (each line sent to it is checked)")
        return Judgement(command.strip(), preview=f"open session {args.get('session')!r}: {command.strip()}")

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        name = _session_arg(args)
        command = args.get("command")
        if command is not None and not isinstance(command, str):
            raise ToolError("command must be a string")
        cols, rows = args.get("cols", 120), args.get("rows", 32)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (cols, rows)):
            raise ToolError("cols and rows must be integers")
        argv = DEFAULT_SHELL if not command or not command.strip() else ["bash", "-c", command]
        terms = self._terminals(ctx.env)
        try:
            session = terms.open(name, argv, cols, rows)
        except TerminalError as e:
            raise ToolError(str(e)) from None
        return _wait_and_read(session, {"timeout": 10, "_first_output": True}, 10, "screen", ctx.env)


class TerminalSendTool(_TerminalTool):
    name = "terminal_send"
    description = (
        "Type into a terminal, then return its screen once the output is quiet (or wait_for shows, or timeout: "
        "default 10 s). input items: a key in angle brackets (<Enter>, <Tab>, <Esc>, <BSpace>, <Up>, <Down>, "
        "<Left>, <Right>, <C-c>, <C-d>, <F1>...) or text (a newline is Enter). Example: [\"ls\", \"<Enter>\"]."
    )
    parameters = {
        "type": "object",
        "properties": {
            "session": SESSION,
            "input": {"type": "array", "items": {"type": "string"}},
            "wait_for": WAIT_FOR,
            "timeout": TIMEOUT,
            "read": READ_MODE,
        },
        "required": ["session", "input"],
    }

    def __init__(self) -> None:
        self._approved: dict[tuple[int, str], tuple] = {}

    def judge(self, args: dict[str, Any], env: Any) -> Judgement:
        try:
            session = env.terminals.get(args.get("session"))
            items = parse_input(args.get("input"))
        except (TerminalError, ToolError):
            return Judgement(None, reason="nothing is sent (the call will fail)")
        j = self._judge(session, items)
        self._approved[(id(env), session.name)] = j.basis
        return j

    def _judge(self, session, items) -> Judgement:
        fg, leader, canonical = session.foreground()
        at_shell = is_shell(fg) or (is_shell(leader) and canonical)
        typed = getattr(session, "typed", "")
        if not at_shell:
            why = f"keystrokes to {fg or 'the program'} in the sandbox"
            return Judgement(None, basis=(False, fg, None), reason=why)
        lines, _rest, why = shell_lines(typed, items)
        if why:
            return Judgement(refuse=why, basis=(True, fg, why))
        subject = "\n".join(lines) or None
        preview = f"send to session {session.name!r} ({fg} runs it):\n{subject}" if subject else ""
        return Judgement(subject, preview=preview, basis=(True, fg, subject),
                         reason="text typed at a shell prompt; nothing runs until Enter")  # fmt: skip

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        items = parse_input(require(args, "input", (str, list)))
        if not items:
            raise ToolError("input is empty")
        try:
            session = ctx.env.terminals.get(_session_arg(args))
        except TerminalError as e:
            raise ToolError(str(e)) from None
        now = self._judge(session, items)
        approved = self._approved.pop((id(ctx.env), session.name), None)
        if now.refuse:
            raise ToolError(now.refuse)
        if now.subject is not None and approved != now.basis:
            raise ToolError("the terminal's foreground program changed since this call was checked; nothing was "
                            "sent (read the screen and send again)")  # fmt: skip
        if now.basis[0]:
            session.typed = shell_lines(getattr(session, "typed", ""), items)[1]
        else:
            session.typed = ""
        try:
            session.send(encode(items))
        except TerminalError as e:
            raise ToolError(str(e)) from None
        return _wait_and_read(session, args, 10, "screen", ctx.env)


class TerminalReadTool(_TerminalTool):
    name = "terminal_read"
    kind = READ
    description = (
        "Read a terminal's screen (or read=new: the lines since the last read, for a log). With wait_for or "
        "timeout it waits first: for the pattern, or for quiet."
    )
    parameters = {
        "type": "object",
        "properties": {"session": SESSION, "read": READ_MODE, "wait_for": WAIT_FOR, "timeout": TIMEOUT},
        "required": ["session"],
    }

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            session = ctx.env.terminals.get(_session_arg(args))
        except TerminalError as e:
            raise ToolError(str(e)) from None
        default = 30.0 if args.get("wait_for") else 0.0
        return _wait_and_read(session, args, default, "screen", ctx.env)


class TerminalResizeTool(_TerminalTool):
    name = "terminal_resize"
    kind = READ
    description = "Resize a terminal; returns its screen."
    parameters = {
        "type": "object",
        "properties": {"session": SESSION, "cols": {"type": "integer"}, "rows": {"type": "integer"}},
        "required": ["session", "cols", "rows"],
    }

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        cols, rows = require(args, "cols", int), require(args, "rows", int)
        try:
            terms = ctx.env.terminals
            session = terms.get(_session_arg(args))
            session.resize(*terms.check_size(cols, rows))
        except TerminalError as e:
            raise ToolError(str(e)) from None
        return _wait_and_read(session, {"timeout": 1}, 1, "screen", ctx.env)


class TerminalCloseTool(_TerminalTool):
    name = "terminal_close"
    kind = READ
    description = "Close a terminal, killing what runs in it; returns its last screen."
    parameters = {"type": "object", "properties": {"session": SESSION}, "required": ["session"]}

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        name = _session_arg(args)
        try:
            terms = ctx.env.terminals
            last = terms.get(name).read("screen")
            terms.close(name)
        except TerminalError as e:
            raise ToolError(str(e)) from None
        return ToolResult(f"{last}\n[session {name} closed]", data={"session": name})


def terminal_tools() -> list:
    return [TerminalOpenTool(), TerminalSendTool(), TerminalReadTool(), TerminalResizeTool(), TerminalCloseTool()]
