"""Interactive terminal sessions: a program in a pseudo-terminal, its screen kept by a terminal emulator.

    TerminalSession  one program on a pty: keystrokes in, output read by a thread into a pyte screen (what a
                     terminal would show, colours dropped) and a scrollback of the lines that scrolled off
    Terminals        the named sessions of one agent session: limits on count, output and idle time; all closed
                     with the agent session (Environment.close)

Why the kernel's pty (os.openpty + subprocess) and pyte, not tmux or ptyprocess: a session must start inside
the command sandbox exactly as a `bash` command does (Environment.wrap_argv: bubblewrap, the scrubbed environment,
the rlimits). ptyprocess forks with the pty already the controlling terminal of the outer process, which
bubblewrap's --new-session drops and a program without capabilities cannot take back. tmux keeps a server and a
socket that outlive the client, and each screen read is a `capture-pane` process (a fork and exec per poll;
reading pyte's in-memory screen costs microseconds: benchmarks/bench_terminal.py). pyte is a maintained
pure-Python VT100/xterm emulator (the one textual-terminal draws with); it parses every escape sequence, so no
hand-written ANSI stripping decides what the model sees, and it answers a program's queries (cursor position,
device attributes) through `write_process_input`. The pty itself is the kernel's: `setsid -c` (util-linux) inside
the sandbox makes it the program's controlling terminal (bubblewrap's --new-session drops the one it had, which is
what keeps a sandboxed program from typing into the *user's* terminal; this pty is the session's own).

No orphans: inside the sandbox every process of a session lives in bubblewrap's pid namespace, which dies with
glm5 (--die-with-parent is PR_SET_PDEATHSIG); without the sandbox a keeper (agent/term_keeper.py, a child subreaper
with PR_SET_PDEATHSIG) ends everything the program started when the program exits, when the session is closed and
when glm5 dies, kill -9 included. Both are started from a thread that lives as long as glm5 (agent/spawn.py: the
kernel's parent-death signal follows the starting *thread*, and the TUI's turns run in threads that end).

Knows nothing of models or permissions: agent/tools/terminal.py judges what may be sent.
"""

from __future__ import annotations

import fcntl
import inspect
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections import deque
from dataclasses import dataclass

import pyte
import regex

from agent import host_path, spawn
from agent.child_env import scrubbed_env

# Named keys the model may send, as xterm sends them (normal cursor mode).
KEYS = {
    "Enter": "\r", "Tab": "\t", "BTab": "\x1b[Z", "Esc": "\x1b", "Escape": "\x1b", "BSpace": "\x7f",
    "Space": " ", "Up": "\x1b[A", "Down": "\x1b[B", "Right": "\x1b[C", "Left": "\x1b[D",
    "Home": "\x1b[H", "End": "\x1b[F", "PageUp": "\x1b[5~", "PageDown": "\x1b[6~", "Delete": "\x1b[3~",
    "Insert": "\x1b[2~", **{f"F{i}": s for i, s in enumerate(
        ["\x1bOP", "\x1bOQ", "\x1bOR", "\x1bOS", "\x1b[15~", "\x1b[17~", "\x1b[18~", "\x1b[19~", "\x1b[20~",
         "\x1b[21~", "\x1b[23~", "\x1b[24~"], start=1)},
    **{f"C-{c}": chr(ord(c) - 96) for c in "abcdefghijklmnopqrstuvwxyz"},
    "C-[": "\x1b", "C-\\": "\x1c", "C-]": "\x1d", "C-_": "\x1f", "C-@": "\x00",
}  # fmt: skip
PATTERN_TIMEOUT_S = 0.5  # the longest one search of a wait_for pattern may take (it runs again on new output)
KEEPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "term_keeper.py")
SHELLS = ("bash", "sh", "zsh", "dash", "ksh", "fish", "mksh", "ash")


class TerminalError(Exception):
    """A session cannot do what was asked (unknown, closed, over a limit); the message is for the model."""


@dataclass(frozen=True)
class TerminalLimits:
    max_sessions: int = 8
    max_cols: int = 400
    max_rows: int = 200
    scrollback_lines: int = 5000
    max_output_mb: float = 64.0  # a session that prints more is killed (a runaway `yes`)
    idle_s: float = 1800.0  # a session no call has touched for this long is closed


class _Screen(pyte.Screen):
    """pyte's screen, keeping the lines that scroll off the top (the scrollback) and answering the program's
    queries (cursor position, device attributes) through `reply`."""

    def __init__(self, cols: int, rows: int, scrollback: int):
        super().__init__(cols, rows)
        self.scrolled: deque[str] = deque(maxlen=scrollback)
        self.n_scrolled = 0  # lines ever scrolled off (the deque forgets the oldest)
        self.reply = None

    def index(self) -> None:
        top, bottom = self.margins or pyte.screens.Margins(0, self.lines - 1)
        if self.cursor.y == bottom and top == 0:  # a full-screen scroll: the top line leaves the screen
            self.scrolled.append(self.row_text(0))
            self.n_scrolled += 1
        super().index()

    def row_text(self, y: int) -> str:
        line = self.buffer[y]
        return "".join(line[x].data for x in range(self.columns)).rstrip()

    def write_process_input(self, data: str) -> None:
        if self.reply is not None:
            self.reply(data)


def _ignore_private(fn):
    def method(self, *args, private: bool = False, **kw):
        if not private:
            return fn(self, *args, **kw)

    return method


# pyte 0.8 hands every CSI with a `?` or `>` prefix to its handler with `private=True`, and most handlers take no
# such argument (`CSI > 4;2 m`, xterm's modifyOtherKeys, which vim sends, raised TypeError in the reader): a private
# variant the emulator does not know is ignored, as a terminal without the feature ignores it.
for _name in set(pyte.Stream.csi.values()):
    _fn = getattr(pyte.Screen, _name, None)
    if _fn is not None and "private" not in inspect.signature(_fn).parameters:
        setattr(_Screen, _name, _ignore_private(_fn))


class TerminalSession:
    """One program on a pty. A reader thread feeds its output to the screen; `wait` watches for quiet or a
    pattern. Thread-safe: the tool calls and the reader share `lock`."""

    def __init__(self, name: str, argv: list[str], cwd: str, env: dict[str, str], cols: int, rows: int,
                 limits: TerminalLimits, sandboxed: bool, wrap=lambda argv: argv):  # fmt: skip
        """`wrap`: how the environment wraps a command's argv (the sandbox); `sandboxed`: whether it does."""
        self.name, self.limits, self.sandboxed = name, limits, sandboxed
        self.command = argv
        self.lock = threading.Condition()
        self.screen = _Screen(cols, rows, limits.scrollback_lines)
        self.stream = pyte.ByteStream(self.screen)
        self.screen.reply = self._reply
        self.master, slave = os.openpty()
        os.set_blocking(self.master, False)  # a send to a program that does not read must not hang (send)
        _set_size(slave, cols, rows)
        env = {**env, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        try:
            if sandboxed:  # bubblewrap's pid namespace holds the session; `setsid -c` gives it the pty
                setsid = host_path.which("setsid") or "/usr/bin/setsid"
                argv_ = wrap([setsid, "-w", "-c", *argv])
            else:  # the keeper gives it the pty and ends all it leaves behind (agent/term_keeper.py)
                argv_ = wrap([sys.executable, "-I", "-S", KEEPER, str(os.getpid()), "--", *argv])
            self.proc = spawn.popen(argv_, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True,
                                    start_new_session=sandboxed)  # fmt: skip
        except OSError as e:
            os.close(self.master)
            raise TerminalError(f"could not start {argv[0]}: {e}") from None
        finally:
            os.close(slave)
        self.started = self.last_output = self.last_used = time.monotonic()
        self.n_bytes = 0
        self.parse_errors, self.last_parse_error = 0, ""  # escape sequences the emulator could not take
        self.exit_note = ""  # why the session ended, when glm5 ended it
        self.returncode: int | None = None
        self.mark = (0, 0)  # (n_scrolled, cursor row) at the last read: where "new" output starts
        self.typed = ""  # what was typed at a shell prompt and not yet run (agent/tools/terminal.py judges it)
        self._reader = threading.Thread(target=self._read_loop, daemon=True, name=f"glm5-term-{name}")
        self._reader.start()

    # -- the reader ------------------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        max_bytes = int(self.limits.max_output_mb * 2**20)
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.5)
            except (OSError, ValueError):
                break
            if not ready:
                if time.monotonic() - self.last_used > self.limits.idle_s:
                    self.kill(f"closed after {self.limits.idle_s:g}s without a call")
                    break
                continue
            try:
                data = os.read(self.master, 65536)
            except BlockingIOError:
                continue
            except OSError:  # EIO: every process holding the slave has exited
                data = b""
            if not data:
                break
            with self.lock:
                self._feed(data)
                self.n_bytes += len(data)
                self.last_output = time.monotonic()
                self.lock.notify_all()
            if self.n_bytes > max_bytes:
                self.kill(f"killed: it printed more than {self.limits.max_output_mb:g} MB")
                break
        rc = self.proc.wait()
        with self.lock:
            self.returncode = rc
            self.lock.notify_all()

    def _feed(self, data: bytes) -> None:
        """Into the emulator. A sequence pyte cannot take (its handler raises) must not stop the reader, or the
        program would block on a full pty: the parser starts afresh, the screen kept, and the session notes it."""
        try:
            self.stream.feed(data)
        except Exception as e:  # noqa: BLE001 - any parser failure, on output the program chose
            self.stream = pyte.ByteStream(self.screen)
            self.parse_errors += 1
            self.last_parse_error = f"{type(e).__name__}: {e}"[:200]

    def _reply(self, data: str) -> None:
        try:
            os.write(self.master, data.encode())
        except OSError:
            pass

    # -- state -----------------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.returncode is None and self.proc.poll() is None

    def _ioctl_pid(self, request: int) -> int | None:
        try:
            return struct.unpack("i", fcntl.ioctl(self.master, request, b"\0\0\0\0"))[0]
        except OSError:
            return None

    def foreground(self) -> tuple[str | None, str | None, bool]:
        """(program in the foreground, the session leader's program, whether the terminal is in canonical
        mode), each as the kernel sees it now: the foreground process group and the session of the pty."""
        fg = self._ioctl_pid(termios.TIOCGPGRP)
        sid = self._ioctl_pid(getattr(termios, "TIOCGSID", 0x5429))
        try:
            canonical = bool(termios.tcgetattr(self.master)[3] & termios.ICANON)
        except termios.error:
            canonical = True
        return _program(fg), _program(sid), canonical

    # -- input -----------------------------------------------------------------------------------------------

    def send(self, data: str, timeout_s: float = 10.0) -> None:
        """Write keystrokes. The pty holds a few KB a program has not read yet: past that, a program in raw mode that
        does not read its input would block the agent, so the send stops at `timeout_s` and says how much went in.
        (A program in cooked mode that does not read loses what is past the line discipline's 4 KiB line, as on
        any terminal: the kernel drops it and the write does not block.)"""
        if not self.alive:
            raise TerminalError(f"session {self.name!r} has ended{self._ended()}; open a new one")
        self.last_used = time.monotonic()
        raw = data.encode("utf-8")
        total, deadline = len(raw), time.monotonic() + timeout_s
        while raw:
            try:
                n = os.write(self.master, raw)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TerminalError(f"session {self.name!r}: sent {total - len(raw)} of {total} bytes; the "
                                        f"program has not read its input for {timeout_s:g}s") from None  # fmt: skip
                time.sleep(0.01)
                continue
            except OSError as e:
                raise TerminalError(f"session {self.name!r}: cannot send: {e}") from None
            raw = raw[n:]

    def resize(self, cols: int, rows: int) -> None:
        with self.lock:
            self.screen.resize(rows, cols)
            _set_size(self.master, cols, rows)  # the kernel sends SIGWINCH to the foreground job
        self.last_used = time.monotonic()

    # -- waiting and reading ---------------------------------------------------------------------------------

    def wait(self, quiet_s: float = 0.3, pattern: str | None = None, timeout_s: float = 10.0,
             interrupt: threading.Event | None = None, first_output: bool = False) -> str:  # fmt: skip
        """Until the output has been quiet for `quiet_s` (after at least one poll), `pattern` (a regex) shows on
        the screen or in the new lines, the program exits, `interrupt` is set (the user's Esc) or `timeout_s`
        passes. Returns which. `first_output`: quiet counts only once the program has printed something (a
        program just started under a busy machine may take longer than `quiet_s` to show its prompt). The
        pattern is searched outside the lock (the reader keeps reading), and only
        when there is new output."""
        # The pattern is the model's: `regex` (not `re`) so that one built to backtrack forever is stopped
        rx = regex.compile(pattern, regex.M) if pattern else None
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        searched = -1
        while True:
            with self.lock:
                text = None
                if rx is not None and self.n_bytes != searched:
                    searched, text = self.n_bytes, self._new_text() + "\n" + self._screen_text()
                ended = self.returncode is not None
                last_output = self.last_output
                printed = self.n_bytes > 0
            if text is not None and self._search(rx, text):
                return "pattern"
            now = time.monotonic()
            if ended or (self.proc.poll() is not None and not self._reader.is_alive()):
                return "exited"
            if interrupt is not None and interrupt.is_set():
                return "interrupted"
            if rx is None and (printed or not first_output) and now - max(last_output, t0) >= quiet_s:
                return "quiet"
            if now >= deadline:
                return "timeout"
            step = min(deadline - now, 0.1 if rx is not None or interrupt is not None else quiet_s)
            with self.lock:
                if self.n_bytes == searched or rx is None:
                    self.lock.wait(timeout=max(0.005, step))

    def _search(self, rx, text: str) -> bool:
        try:
            return rx.search(text, timeout=PATTERN_TIMEOUT_S) is not None
        except TimeoutError:
            raise TerminalError(f"session {self.name!r}: wait_for took over {PATTERN_TIMEOUT_S:g}s to search the "
                                "screen (nested repetition backtracks); give a simpler pattern") from None  # fmt: skip

    def _screen_text(self) -> str:
        rows = [self.screen.row_text(y) for y in range(self.screen.lines)]
        while rows and not rows[-1]:
            rows.pop()
        return "\n".join(rows)

    def _new_text(self) -> str:
        """The lines since the last read: those that scrolled off since, less the ones that were already on
        the screen above the cursor then, and the screen down to the cursor's row."""
        n0, row0 = self.mark
        s = self.screen.n_scrolled - n0
        seen_scrolled = min(s, row0)
        fresh = max(0, s - seen_scrolled)
        kept = min(fresh, len(self.screen.scrolled))
        lines = list(self.screen.scrolled)[-kept:] if kept else []
        if fresh > kept:  # the scrollback holds the last `scrollback_lines` lines only
            lines.insert(0, f"[... {fresh - kept} earlier lines were not kept (the scrollback holds "
                            f"{self.screen.scrolled.maxlen}) ...]")  # fmt: skip
        start = max(0, row0 - s)
        lines += [self.screen.row_text(y) for y in range(start, self.screen.cursor.y + 1)]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)

    def read(self, what: str = "screen") -> str:
        """`screen`: the screen as shown now, with a header naming the cursor; `new`: the lines since the last
        read. Either moves the mark for the next `new`."""
        with self.lock:
            body = self._new_text() if what == "new" else self._screen_text()
            cur = self.screen.cursor
            self.mark = (self.screen.n_scrolled, cur.y)
            state = "running" if self.alive else f"exited{self._ended()}"
            head = (f"[terminal {self.name}: {self.screen.columns}x{self.screen.lines}, cursor at row {cur.y + 1} "
                    f"col {cur.x + 1}, {state}]")  # fmt: skip
        self.last_used = time.monotonic()
        return f"{head}\n{body}" if body else f"{head}\n(empty)"

    def _ended(self) -> str:
        rc = self.returncode if self.returncode is not None else self.proc.poll()
        note = f" ({self.exit_note})" if self.exit_note else ""
        return (f" with code {rc}" if rc is not None else "") + note

    # -- end -------------------------------------------------------------------------------------------------

    def kill(self, note: str = "") -> None:
        """The whole session: the sandbox's pid namespace (the process group of bwrap), or, unsandboxed, the
        program's session and its foreground job, then the keeper ends whatever else it started."""
        if note and not self.exit_note:
            self.exit_note = note
        fg, sid = self._ioctl_pid(termios.TIOCGPGRP), self._ioctl_pid(getattr(termios, "TIOCGSID", 0x5429))
        for pg in {p for p in (fg, sid) if p and p > 1}:
            _signal_group(pg)
        if self.proc.poll() is None:
            if self.sandboxed:  # bwrap leads its own process group; its pid namespace dies with it
                _signal_group(self.proc.pid)
            else:  # the keeper ends what the program left behind (background jobs are in groups of their own)
                self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def close(self) -> None:
        self.kill()
        self._reader.join(timeout=5)
        try:
            os.close(self.master)
        except OSError:
            pass


def _signal_group(pgid: int) -> None:
    if pgid == os.getpgrp():  # never glm5's own group (a program not yet in its own session)
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _program(pid: int | None) -> str | None:
    """The program a process runs: its executable's name (a rename by prctl does not change it), else comm."""
    if not pid or pid <= 0:
        return None
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).removesuffix(" (deleted)")
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def is_shell(program: str | None) -> bool:
    return bool(program) and re.sub(r"[\d.]+$", "", program) in SHELLS


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminals:
    """The named sessions of one agent session. `wrap` is how the environment wraps a command's argv (the
    sandbox); `sandboxed` whether it does."""

    def __init__(self, wrap, cwd: str, env: dict[str, str] | None, sandboxed: bool,
                 limits: TerminalLimits | None = None):
        self.wrap, self.cwd, self.sandboxed = wrap, cwd, sandboxed
        if env is None:
            env = scrubbed_env()
        self.env = env
        self.limits = limits or TerminalLimits()
        self.sessions: dict[str, TerminalSession] = {}

    def open(self, name: str, argv: list[str], cols: int = 120, rows: int = 32) -> TerminalSession:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", name):
            raise TerminalError(f"bad session name {name!r}: 1-32 letters, digits, '_', '-', '.'")
        old = self.sessions.get(name)
        if old is not None and old.alive:
            raise TerminalError(f"session {name!r} is already open; close it first or use another name")
        if old is not None:
            self.close(name)
        live = [s for s in self.sessions.values() if s.alive]
        if len(live) >= self.limits.max_sessions:
            raise TerminalError(f"{len(live)} sessions are open (the limit is {self.limits.max_sessions}); "
                                f"close one first: {', '.join(s.name for s in live)}")  # fmt: skip
        ended = sorted((s for s in self.sessions.values() if not s.alive), key=lambda s: s.last_used)
        for s in ended[: max(0, len(self.sessions) - self.limits.max_sessions + 1)]:
            self.close(s.name)  # an ended session's last screen stays readable until more sessions need room
        cols, rows = self.check_size(cols, rows)
        session = TerminalSession(name, argv, self.cwd, self.env, cols, rows, self.limits, self.sandboxed, self.wrap)
        self.sessions[name] = session
        return session

    def check_size(self, cols: int, rows: int) -> tuple[int, int]:
        lim = self.limits
        if not (10 <= cols <= lim.max_cols and 2 <= rows <= lim.max_rows):
            raise TerminalError(f"size {cols}x{rows} is out of range: 10-{lim.max_cols} columns, "
                                f"2-{lim.max_rows} rows")  # fmt: skip
        return cols, rows

    def get(self, name: str) -> TerminalSession:
        s = self.sessions.get(name)
        if s is None:
            known = ", ".join(self.sessions) or "none"
            raise TerminalError(f"no terminal session named {name!r} (open: {known}); open it with terminal_open")
        return s

    def close(self, name: str) -> None:
        self.get(name).close()
        del self.sessions[name]

    def close_all(self) -> None:
        for name in list(self.sessions):
            self.close(name)

    def live_screens(self) -> str:
        """Each live session's screen (what compaction keeps)."""
        out = []
        for s in self.sessions.values():
            if s.alive:
                with s.lock:
                    text = s._screen_text()
                out.append(f"[terminal {s.name}, still open; its screen now]\n{text or '(empty)'}")
        return "\n\n".join(out)
