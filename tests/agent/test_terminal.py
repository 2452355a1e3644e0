"""Terminal sessions (agent/terminal.py): a program on a pty, its screen as pyte renders it, named keys, waits,
limits, and no process left behind when a session is closed or glm5 is killed with SIGKILL (a `nohup` job
included), while a session started by a thread that ends (a TUI turn) lives on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agent.sandbox import Sandbox, probe
from agent.terminal import TerminalError, TerminalLimits, Terminals
from agent.tools.terminal import DEFAULT_SHELL

SANDBOX = probe(False) is None
MODES = [False, pytest.param(True, marks=pytest.mark.skipif(not SANDBOX, reason="bubblewrap cannot run here"))]


def _terms(tmp_path: Path, sandboxed: bool, limits: TerminalLimits | None = None) -> Terminals:
    root, scratch = tmp_path / "repo", tmp_path / "scratch"
    root.mkdir(exist_ok=True)
    scratch.mkdir(exist_ok=True)
    if sandboxed:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        sb = Sandbox(True)
        wrap = lambda argv: sb.wrap(argv, root=root, cwd=root, scratch=scratch)  # noqa: E731
    else:
        wrap = lambda argv: argv  # noqa: E731
    return Terminals(wrap, str(root), {"PATH": os.environ["PATH"], "HOME": str(scratch)}, sandboxed, limits)


@pytest.fixture(params=MODES, ids=["plain", "sandbox"])
def terms(request, tmp_path):
    t = _terms(tmp_path, request.param)
    yield t
    t.close_all()


def test_shell_line_round_trip_and_new_output(terms):
    s = terms.open("main", DEFAULT_SHELL, 80, 10)
    assert s.wait(timeout_s=20, first_output=True) == "quiet"
    assert s.read().splitlines()[1] == "$"
    s.send("for i in $(seq 25); do echo line$i; done\r")
    assert s.wait(pattern=r"line25\n\$", timeout_s=10) == "pattern"
    new = s.read("new").splitlines()
    # every line since the last read, though only 10 rows fit on the screen
    assert new[1] == "$ for i in $(seq 25); do echo line$i; done"
    assert new[2:27] == [f"line{i}" for i in range(1, 26)] and new[-1] == "$"
    s.send("echo again\r")
    s.wait(pattern="^again$", timeout_s=10)
    assert s.read("new").splitlines()[1:] == ["$ echo again", "again", "$"]


def test_screen_is_rendered_with_cursor_and_without_colours(terms):
    s = terms.open("paint", ["bash", "-c", r"printf '\033[2J\033[5;10H\033[31mred\033[0m here'; sleep 30"], 40, 8)
    s.wait(pattern="here", timeout_s=10)
    head, *rows = s.read().splitlines()
    assert rows[4] == " " * 9 + "red here"
    assert "cursor at row 5 col 18" in head and "\033" not in "".join(rows)


def test_keys_interrupt_and_a_repl(terms):
    s = terms.open("py", DEFAULT_SHELL)
    s.wait(timeout_s=20, first_output=True)
    s.send("sleep 100\r")
    s.wait(quiet_s=0.3, timeout_s=5)
    assert s.foreground()[0] == "sleep"
    s.send("\x03")  # <C-c>
    assert s.wait(pattern=r"^\^C\n\$$", timeout_s=10) == "pattern"
    assert s.foreground()[0] == "bash"
    s.send(f"{sys.executable} -q\r")
    assert s.wait(pattern="^>>>$", timeout_s=20) == "pattern"  # lines are matched without trailing spaces
    s.send("6*7\r")
    assert s.wait(pattern="^42$", timeout_s=10) == "pattern"
    assert s.foreground()[0].startswith("python")


def test_resize_reaches_the_program(terms):
    s = terms.open("r", DEFAULT_SHELL, 80, 24)
    s.wait(timeout_s=20, first_output=True)
    s.resize(100, 30)
    s.send("stty size\r")
    assert s.wait(pattern="^30 100$", timeout_s=10) == "pattern"


def test_several_sessions_and_their_limits(tmp_path):
    terms = _terms(tmp_path, False, TerminalLimits(max_sessions=2))
    try:
        a, b = terms.open("a", DEFAULT_SHELL), terms.open("b", DEFAULT_SHELL)
        a.send("echo from-a\r")
        b.send("echo from-b\r")
        assert a.wait(pattern="^from-a", timeout_s=10) == "pattern" and "from-b" not in a.read()
        with pytest.raises(TerminalError, match="limit is 2"):
            terms.open("c", DEFAULT_SHELL)
        with pytest.raises(TerminalError, match="already open"):
            terms.open("a", DEFAULT_SHELL)
        with pytest.raises(TerminalError, match="bad session name"):
            terms.open("../x", DEFAULT_SHELL)
        with pytest.raises(TerminalError, match="out of range"):
            terms.check_size(5000, 10)
        terms.close("a")
        with pytest.raises(TerminalError, match="no terminal session named 'a'"):
            terms.get("a")
        terms.open("c", DEFAULT_SHELL)
    finally:
        terms.close_all()


def test_runaway_output_and_idle_sessions_are_ended(tmp_path):
    terms = _terms(tmp_path, False, TerminalLimits(max_output_mb=0.2, idle_s=1.0))
    try:
        loud = terms.open("loud", ["bash", "-c", "yes"])
        idle = terms.open("idle", DEFAULT_SHELL)
        deadline = time.monotonic() + 20
        while (loud.alive or idle.alive) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not loud.alive and "printed more than 0.2 MB" in loud.read()
        assert not idle.alive and "without a call" in idle.read()
        with pytest.raises(TerminalError, match="has ended"):
            idle.send("echo\r")
    finally:
        terms.close_all()


ORPHAN_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.agent.test_terminal import _terms
    from pathlib import Path
    from agent.tools.terminal import DEFAULT_SHELL
    terms = _terms(Path({tmp!r}), {sandboxed!r})
    s = terms.open("main", DEFAULT_SHELL)
    s.wait(timeout_s=20, first_output=True)
    s.send("nohup sleep {a} >/dev/null 2>&1 & sleep {b}\\r")
    while s.foreground()[0] != "sleep":
        s.wait(quiet_s=0.1, timeout_s=1)
    print("READY", flush=True)
    time.sleep(60)
""")


def _sleepers(*marks: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:1] == [b"sleep"] or argv[0].endswith(b"/sleep"):
                if any(m.encode() in argv for m in marks):
                    out.append(int(pid))
    return out


@pytest.mark.parametrize("sandboxed", MODES, ids=["plain", "sandbox"])
def test_no_orphans_after_kill_9_of_glm5(tmp_path, sandboxed):
    a, b = f"{4000 + os.getpid() % 1000}.{int(sandboxed) + 1}1", f"{4000 + os.getpid() % 1000}.{int(sandboxed) + 1}2"
    code = ORPHAN_SCRIPT.format(root=str(Path(__file__).parents[2]), tmp=str(tmp_path), sandboxed=sandboxed, a=a, b=b)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        # the background job and the foreground one are running (under load the background one's fork may not
        # have become `sleep` yet when the foreground one has: wait for both)
        deadline = time.monotonic() + 10
        while len(_sleepers(a, b)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_sleepers(a, b)) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _sleepers(a, b) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sleepers(a, b) == []
    finally:
        for pid in _sleepers(a, b):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def _start_in_thread(fn):
    """`fn()` in a thread that has ended when this returns (a TUI turn, which goes on for a while after)."""
    out = []
    t = threading.Thread(target=lambda: (out.append(fn()), time.sleep(1.0)))
    t.start()
    t.join()
    return out[0]


def test_a_session_outlives_the_thread_that_opened_it(terms):
    # PR_SET_PDEATHSIG follows the thread that started a child: a session opened in one turn's thread was killed
    # when that turn ended
    s = _start_in_thread(lambda: terms.open("main", DEFAULT_SHELL))
    s.wait(timeout_s=20, first_output=True)
    time.sleep(0.5)
    assert s.alive
    s.send("echo still here\r")
    assert s.wait(pattern="^still here$", timeout_s=10) == "pattern"


def test_closing_a_session_ends_its_background_and_nohup_jobs(terms):
    a, b = (
        f"{5000 + os.getpid() % 1000}.{int(terms.sandboxed) + 1}1",
        f"{5000 + os.getpid() % 1000}.{int(terms.sandboxed) + 1}2",
    )
    s = terms.open("main", DEFAULT_SHELL)
    s.wait(timeout_s=20, first_output=True)
    s.send(f"sleep {a} & nohup sleep {b} >/dev/null 2>&1 &\r")
    deadline = time.monotonic() + 10
    while len(_sleepers(a, b)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_sleepers(a, b)) == 2
    terms.close("main")
    assert _sleepers(a, b) == []


def test_the_program_ending_ends_what_it_left_behind(terms):
    mark = f"{6000 + os.getpid() % 1000}.{int(terms.sandboxed) + 1}"
    s = terms.open("main", ["bash", "-c", f"nohup sleep {mark} >/dev/null 2>&1 & echo started; exit 3"])
    assert s.wait(timeout_s=20) == "exited"
    assert "with code 3" in s.read()
    deadline = time.monotonic() + 10
    while _sleepers(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sleepers(mark) == []


@pytest.mark.skipif(shutil.which("vim") is None, reason="vim is not installed")
def test_a_full_screen_editor_driven_by_keys(terms):
    root = Path(terms.cwd)
    s = terms.open("vim", ["vim", "-u", "NONE", "-i", "NONE", "-N", "notes.txt"], 60, 12)
    s.wait(timeout_s=20, first_output=True)
    s.send("i")
    assert s.wait(pattern="-- INSERT --", timeout_s=10) == "pattern"
    s.send("hello from vim\x1b")  # <Esc>
    s.send(":wq\r")
    assert s.wait(timeout_s=10) == "exited"
    assert (root / "notes.txt").read_text() == "hello from vim\n"


@pytest.mark.skipif(shutil.which("less") is None, reason="less is not installed")
def test_a_pager_screen_follows_its_keys(terms):
    root = Path(terms.cwd)
    (root / "long.txt").write_text("".join(f"row {i}\n" for i in range(1, 101)))
    s = terms.open("less", ["less", "long.txt"], 40, 10)
    assert s.wait(pattern="^row 9$", timeout_s=20) == "pattern"
    assert "row 10\n" not in s.read() + "\n"
    s.send("G")
    assert s.wait(pattern="^row 100$", timeout_s=10) == "pattern"
    assert "row 1\n" not in s.read()
    s.send("q")
    assert s.wait(timeout_s=10) == "exited"


def test_escape_sequences_the_emulator_does_not_know_do_not_stop_the_reader(terms):
    # private CSI variants (`CSI > 4;2 m` is what vim sends) made pyte 0.8's handlers raise in the reader thread,
    # after which the session's output was never read again
    s = terms.open("esc", ["bash", "-c", r"printf '\033[>4;2m\033[?1A\033[?5Pfirst\n'; read x; echo second-$x"])
    assert s.wait(pattern="^first$", timeout_s=20) == "pattern"
    s.screen.draw = None  # the next output makes the emulator itself fail: the reader must survive that too
    s.send("x\r")
    deadline = time.monotonic() + 10
    while not s.parse_errors and time.monotonic() < deadline:
        time.sleep(0.05)
    del s.screen.draw
    assert s.parse_errors >= 1 and "TypeError" in s.last_parse_error
    assert s.wait(timeout_s=10) == "exited"


def test_a_send_to_a_program_that_does_not_read_stops_in_time(terms):
    # A program in raw mode that never reads: the pty's input queue fills (about 4-16 KB) and writes block. (A
    # cooked-mode program's line discipline drops input past its 4 KiB line instead, as on any terminal.)
    prog = "import sys, time, tty; tty.setraw(0); print('raw', flush=True); time.sleep(60)"
    s = terms.open("deaf", [sys.executable, "-c", prog])
    s.wait(pattern="raw", timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(TerminalError, match=r"sent \d+ of 1000000 bytes; the program has not read its input"):
        s.send("x" * 1_000_000, timeout_s=1)
    assert time.monotonic() - t0 < 10


def test_a_pattern_built_to_backtrack_forever_is_stopped(terms):
    # wait_for is the model's regex: with `re`, (x+x+)+y over a screen of x's never returns and the agent hangs
    # (Esc cannot stop a search in progress). Each search is bounded instead, and the call says why it stopped.
    s = terms.open("xs", ["bash", "-c", "printf 'x%.0s' $(seq 3000); sleep 30"])
    s.wait(pattern="x{100}", timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(TerminalError, match="wait_for took over"):
        s.wait(pattern=r"(x+x+)+y", timeout_s=60)
    assert time.monotonic() - t0 < 15
