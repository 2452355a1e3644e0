"""The rollout engine in its own process (`glm5 finetune rl --rollout-engine process`): the run starts a local
`glm5 serve` child for the policy and drives it through the HTTP path (remote.HttpServer), so sampling and
training run in two processes with their own interpreters, instead of an engine thread and the trainer taking
turns on one GIL.

The child: `glm5 serve CKPT --host 127.0.0.1 --port 0` (the OS picks the port; the ready line on its stderr
names it; `--quant int4` with `glm5 finetune rl --quant int4`: each pushed adapter is then served beside the int4
weights), a random API key passed in its environment (GLM5_API_KEY, never argv: other users can read argv in
/proc), no prefix cache (every call computed the same way whatever ran before it, as the in-process engine),
its torch threads set through OMP_NUM_THREADS (default half the cores; `split_threads` gives the trainer the
rest). Its lifetime is the run's: PR_SET_PDEATHSIG kills it when the
parent dies (kill -9 included), and `close()` (the context manager's exit, Ctrl-C included) stops it. A resumed
run starts a fresh child on the base checkpoint; run_rl's first push then loads the latest adapter at the
restored version, so the child serves what the killed run last pushed.

Its stderr goes to LOG (the run folder's engine.log), which a failed start quotes.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from finetune.rl.remote import HttpServer

_READY = re.compile(r"ready (http://[0-9.]+:\d+)/v1")
PR_SET_PDEATHSIG = 1


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)  # loaded here, not between fork and exec (dlopen takes locks)
    except OSError:
        return None


def _die_with_parent(libc, parent: int):
    """-> what the child runs between fork and exec: SIGKILL to it when `parent` dies. Linux only; elsewhere
    close() alone stops it. Linux sends it when the thread that forked exits: start the child on a thread that
    lives as long as the run (the main thread, as the CLI does)."""
    prctl = libc.prctl  # resolved here too: the child between fork and exec only calls it

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect: nothing would kill us later
            os._exit(1)

    return preexec


class ServeChild:
    """A `glm5 serve` child over checkpoint `model_dir`; `.server` is the HttpServer the run samples from."""

    def __init__(self, model_dir: Path, log: Path, max_model_len: int, max_num_seqs: int, threads: int,
                 start_timeout_s: float = 300.0, quant: str | None = None):  # fmt: skip
        self.log_path = Path(log)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        key = secrets.token_hex(16)
        env = {**os.environ, "GLM5_API_KEY": key, "OMP_NUM_THREADS": str(self.threads), "COLUMNS": "300"}
        env.pop("GLM5_AUTO_THREADS", None)  # the child's threads are chosen here (glm5cli/threads.py)
        cmd = [sys.executable, "-m", "glm5cli", "serve", str(Path(model_dir).resolve()), "--host", "127.0.0.1",
               "--port", "0", "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
               "--no-prefix-caching", "--no-access-log", *(("--quant", quant) if quant else ())]  # fmt: skip
        # The child must import this checkout's packages, wherever the run was started from.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it for its whole life
        self._start = self._log.tell()  # an earlier child's lines (a resumed run's) are not this one's
        libc = _libc() if sys.platform.startswith("linux") else None
        preexec = _die_with_parent(libc, os.getpid()) if libc is not None else None
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, preexec_fn=preexec)  # fmt: skip
        self._log.write(f"[glm5 finetune rl] started the rollout engine, pid {self.proc.pid}\n".encode())
        self._log.flush()
        try:
            self.url = self._wait_ready(start_timeout_s)
        except BaseException:
            self.close()
            raise
        self.server = HttpServer(self.url, api_key=key)

    def split_threads(self) -> int:
        """This process (the trainer) takes the cores the child does not -> its torch threads."""
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - self.threads))
        return torch.get_num_threads()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(self._start)
                m = _READY.search(f.read().decode(errors="replace"))
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"the rollout engine (glm5 serve) exited with {self.proc.returncode} while "
                                   f"starting; its log {self.log_path} ends:\n{self._tail()}")  # fmt: skip
            time.sleep(0.1)
        raise RuntimeError(f"the rollout engine (glm5 serve) was not ready after {timeout_s:.0f}s; its log "
                           f"{self.log_path} ends:\n{self._tail()}")  # fmt: skip

    def _tail(self, n: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def close(self) -> None:
        """Stop the child (SIGTERM: uvicorn shuts down; SIGKILL after 10 s), close the client."""
        if getattr(self, "server", None) is not None:
            self.server.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> ServeChild:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
