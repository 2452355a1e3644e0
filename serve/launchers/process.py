"""ExternalServer: run an engine's command as a child process and stand in for it until it exits.

What it does, in order: start the child in its own session (so a terminal's Ctrl-C reaches us once, and we decide
what the child gets), copy every line of its log to ours, poll its `/health` until 200 (only where the node serves
HTTP), forward SIGINT / SIGTERM to it, escalate to SIGKILL of its whole process group if it ignores them past a
grace period, and return its exit code (128 + N when it died of signal N, as a shell reports it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import httpx

from serve.launchers.common import EngineCommand


class ExternalServer:
    """One child engine process. `run()` blocks until it exits and returns its exit code."""

    def __init__(
        self,
        command: EngineCommand,
        health_url: str | None,
        log: Callable[[str], None] = print,
        on_ready: Callable[[], None] | None = None,
        startup_timeout: float = 3600.0,  # a 744B checkpoint can take tens of minutes to load
        poll_interval: float = 1.0,
        grace_period: float = 30.0,
        health_headers: dict[str, str] | None = None,
    ):
        self.command = command
        self.health_url = health_url if command.serves_http else None
        self.log = log
        self.on_ready = on_ready
        self.startup_timeout = startup_timeout
        self.poll_interval = poll_interval
        self.grace_period = grace_period
        self.health_headers = health_headers or {}
        self.proc: subprocess.Popen | None = None
        self.ready = threading.Event()
        self._stopping = threading.Event()

    def run(self) -> int:
        env = {**os.environ, **self.command.env}
        self.proc = subprocess.Popen(
            list(self.command.argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        pump = threading.Thread(target=self._pump_log, daemon=True)
        pump.start()
        restore = self._install_signal_handlers()
        try:
            if self.health_url:
                threading.Thread(target=self._wait_healthy, daemon=True).start()
            code = self.proc.wait()
        finally:
            restore()
        pump.join(timeout=5)
        return 128 - code if code < 0 else code

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Pass `sig` to the child; if it is still alive after the grace period, kill its process group."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._stopping.set()
        self.proc.send_signal(sig)
        threading.Thread(target=self._kill_after_grace, daemon=True).start()

    def _kill_after_grace(self) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=self.grace_period)
        except subprocess.TimeoutExpired:
            self.log(f"engine ignored the signal for {self.grace_period:g}s; killing its process group")
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _pump_log(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log(line.rstrip("\n"))

    def _wait_healthy(self) -> None:
        assert self.proc is not None and self.health_url
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(timeout=5.0, headers=self.health_headers) as client:
            while self.proc.poll() is None and not self._stopping.is_set():
                try:
                    if client.get(self.health_url).status_code == 200:
                        self.ready.set()
                        if self.on_ready:
                            self.on_ready()
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.log(f"engine not healthy after {self.startup_timeout:g}s; stopping it")
                    self.stop()
                    return
                time.sleep(self.poll_interval)

    def _install_signal_handlers(self) -> Callable[[], None]:
        """Forward SIGINT / SIGTERM to the child (main thread only: Python allows handlers nowhere else)."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def forward(signum, _frame):
            self.log(f"received {signal.Signals(signum).name}; passing it to the engine")
            self.stop(signum)

        for sig in previous:
            signal.signal(sig, forward)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore
