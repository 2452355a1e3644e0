"""What a terminal session costs an agent that polls: a send-and-read round trip (`echo` typed at a live shell,
returned as soon as its output shows on the screen) and a quiet-wait (the same, returned once the output has
been quiet for `quiet_s`) against a plain `bash` tool call (a fresh `bash -c echo`, to completion), each with and
without the bubblewrap sandbox, through the same Environment the agent uses. Also the first open of a session,
and tmux's round trip (`send-keys`, then `capture-pane` until the line shows), the alternative not taken.

Writes benchmarks/terminal.json and prints a table. Medians over `--n` calls, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from agent.environment import Environment
from agent.sandbox import Sandbox, probe
from agent.tools.terminal import DEFAULT_SHELL


def _ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 2)


def measure(sandboxed: bool, n: int, quiet_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        env = Environment(repo, sandbox=Sandbox(sandboxed), scratch_dir=Path(tmp) / "scratch")
        try:
            t0 = time.perf_counter()
            s = env.terminals.open("bench", DEFAULT_SHELL)
            s.wait(pattern=r"^\$$", timeout_s=30)
            open_s = time.perf_counter() - t0
            bash, pattern, quiet = [], [], []
            for i in range(n):
                t0 = time.perf_counter()
                env.execute(f"echo b{i}")
                bash.append(time.perf_counter() - t0)

                t0 = time.perf_counter()
                s.send(f"echo p{i}\r")
                assert s.wait(pattern=f"^p{i}$", timeout_s=30) == "pattern"
                s.read("new")
                pattern.append(time.perf_counter() - t0)

                t0 = time.perf_counter()
                s.send(f"echo q{i}\r")
                s.wait(quiet_s=quiet_s, timeout_s=30)
                s.read("new")
                quiet.append(time.perf_counter() - t0)
            return {"open_ms": round(open_s * 1e3, 1), "bash_call_ms": _ms(bash), "send_read_pattern_ms": _ms(pattern),
                    "send_read_quiet_ms": _ms(quiet), "quiet_s": quiet_s,
                    "quiet_wait_cost_ms": round(_ms(quiet) - _ms(pattern), 2),
                    "quiet_wait_beyond_period_ms": round(_ms(quiet) - _ms(pattern) - quiet_s * 1e3, 2)}  # fmt: skip
        finally:
            env.close()


def measure_tmux(n: int) -> dict[str, float] | None:
    """The alternative agent/terminal.py did not take: tmux (what Terminus drives), unsandboxed. A round trip is
    `send-keys` then `capture-pane` polled until the line shows: each is a process started."""
    import shutil

    if shutil.which("tmux") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "sock")
        tmux = ["tmux", "-S", sock]
        subprocess.run([*tmux, "new-session", "-d", "-x", "120", "-y", "32", "env", "PS1=$ ", "bash", "--norc",
                        "-i"], check=True)  # fmt: skip
        try:
            rounds, captures = [], 0
            for i in range(n):
                t0 = time.perf_counter()
                subprocess.run([*tmux, "send-keys", f"echo t{i}", "Enter"], check=True)
                while True:
                    captures += 1
                    out = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout
                    if f"\nt{i}\n" in out:
                        break
                rounds.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(n):
                subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True)
            capture_ms = round((time.perf_counter() - t0) / n * 1e3, 2)
            return {"send_read_pattern_ms": _ms(rounds), "capture_pane_ms": capture_ms,
                    "captures_per_round": round(captures / n, 1)}  # fmt: skip
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--quiet", type=float, default=0.3, help="the quiet-wait's quiet period (the tools' default)")
    a = ap.parse_args()
    out = {"load_before": os.getloadavg()[0]}
    modes = [("plain", False)] + ([("sandbox", True)] if probe(False) is None else [])
    for name, sandboxed in modes:
        out[name] = measure(sandboxed, a.n, a.quiet)
    out["tmux"] = measure_tmux(a.n)
    out["load_after"] = os.getloadavg()[0]
    for name, _ in modes:
        r = out[name]
        print(f"{name:8s} open {r['open_ms']:7.1f} ms | bash call {r['bash_call_ms']:6.2f} ms | terminal send+read "
              f"(pattern) {r['send_read_pattern_ms']:6.2f} ms = {r['bash_call_ms'] / r['send_read_pattern_ms']:.1f}x "
              f"faster | quiet-wait {r['send_read_quiet_ms']:6.1f} ms: it costs {r['quiet_wait_cost_ms']:.1f} ms over "
              f"the pattern wait, {r['quiet_wait_beyond_period_ms']:.1f} ms beyond its {r['quiet_s'] * 1e3:.0f} ms "
              "quiet period")  # fmt: skip
    if out["tmux"]:
        t = out["tmux"]
        print(f"tmux     send-keys + capture-pane until it shows {t['send_read_pattern_ms']:6.2f} ms "
              f"({t['captures_per_round']} captures per round; one capture-pane {t['capture_pane_ms']:.2f} ms; "
              f"pyte's screen is read in-process)")  # fmt: skip
    Path(__file__).with_name("terminal.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
