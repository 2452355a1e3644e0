"""The keeper of one unsandboxed terminal session: `python -I -S term_keeper.py PARENT_PID -- PROGRAM ARGS...`.

Started by agent/terminal.py on the session's pty (stdin, stdout and stderr), it runs the program in a session of its
own with the pty as its controlling terminal (what `setsid -c` does), gives up its own hold on the pty (so the
program's exit reaches glm5 as the pty's end), and waits. It is a child subreaper: whatever the program leaves
behind, background jobs, `nohup`, a daemon that forked twice and called setsid, stays its descendant. When the
program exits, when glm5 ends the session (SIGTERM) or when glm5 dies, even by kill -9 (PR_SET_PDEATHSIG delivers
SIGTERM), it ends every descendant: SIGHUP and SIGCONT (a terminal's hangup, which lets an editor keep its work),
then after a short grace SIGKILL, until none is left. It exits as the program did (its code, or its signal as
128+N).

Why a keeper and not PR_SET_PDEATHSIG on the shell alone (`setpriv --pdeathsig HUP`, as before): a shell passes a
hangup on to its jobs only when it takes the signal before it reads the end of its terminal (bash that reads EOF
first exits without a word to its jobs: a background `sleep` outlived a kill -9 of glm5 in CI), a program that ignores
SIGHUP outlived glm5, and ending the session from glm5 reached its foreground job and its leader, not its background
jobs. Inside the sandbox bubblewrap's pid namespace does all of this, so the keeper runs only without it.

Standard library only, run as a script (`-I -S`: nothing from the user's environment or site-packages); glm5's
modules are not importable here and must not be.
"""

import ctypes
import fcntl
import os
import signal
import sys
import termios
import time

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
GRACE_S = 1.0  # from the hangup to SIGKILL
_QUIET = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGHUP)


class _End(Exception):
    """SIGTERM: glm5 ended the session, or died."""


def _on_term(signum, frame):
    raise _End


def _descendants(root: int) -> list[int]:
    """The processes below `root`, from every /proc/PID/stat's parent (a scan: no kernel option needed)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # after "(comm)": state, ppid
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            out.append(pid)
            todo.append(pid)
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def end_all() -> None:
    """Hang up every descendant, then kill what is left until nothing is (a process may fork while we look)."""
    me = os.getpid()
    _signal_all(_descendants(me), signal.SIGHUP)
    _signal_all(_descendants(me), signal.SIGCONT)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        _reap()
        if not _descendants(me):
            return
        time.sleep(0.02)
    for _ in range(200):
        left = _descendants(me)
        if not left:
            return
        _signal_all(left, signal.SIGKILL)
        _reap()
        time.sleep(0.01)


def _start(argv: list[str]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            for sig in (*_QUIET, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"glm5: could not start {argv[0]}: {e.strerror}\r\n".encode())
        finally:
            os._exit(127)
    return pid


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        os.write(2, b"usage: term_keeper.py PARENT_PID -- PROGRAM [ARGS...]\n")
        return 2
    parent, program = int(argv[0]), argv[2:]
    for sig in _QUIET:  # the keeper shares glm5's process group: its Ctrl-C and hangups are glm5's, not ours
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    status = 0
    try:
        if os.getppid() != parent:  # glm5 died before PR_SET_PDEATHSIG was set
            raise _End
        child = _start(program)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        while True:
            pid, st = os.waitpid(-1, 0)  # the program, or an orphan handed to us as subreaper
            if pid == child:
                status = os.waitstatus_to_exitcode(st)
                break
    except _End:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        status = 128 + signal.SIGTERM
    except ChildProcessError:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    end_all()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
