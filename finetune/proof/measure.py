"""The measurement after each stage: `glm5 serve` the stage's checkpoint as deployed (INT4, MTP drafting), run
`glm5 bench swe -k K` on the held-out split against it, and keep the server's speculative-decoding counters.

Both are subprocesses of the CLI; the server gets a fresh API key and a free port, its log goes to
RUN/logs/serve-<stage>.log, and it is stopped (SIGINT, then SIGKILL) whatever happens. The bench run folder
RUN/bench/<stage>/ resumes by itself after a kill; RUN/bench/<stage>.serve.json holds the server's counters
(drafted and accepted tokens, acceptance rate) read from /metrics after the bench.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from finetune.proof.commands import bench_cmd, model_dir, serve_cmd, shown
from finetune.proof.config import ProofConfig

KEY_ENV = "GLM5_PROOF_API_KEY"
_METRIC = re.compile(r"^(glm5:spec_[a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eEinfa]+)$", re.M)


class StageFailed(RuntimeError):
    """A stage's command failed; the message names the command and its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(run: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every subprocess: this checkout first on the path, no inherited API key or GLM5_*
    setting, and the run's own config folder (RUN/config), so the user's ~/.config/glm5 cannot change a stage.
    The run's pinned `threads` (RUN/proof.json), when set, becomes OMP_NUM_THREADS."""
    root = str(Path(__file__).resolve().parents[2])
    # GLM5_AUTO_THREADS stays: it tells a stage that OMP_NUM_THREADS was this process's own choice, not a pin
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_") or k == "GLM5_AUTO_THREADS"}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    (run / "config").mkdir(parents=True, exist_ok=True)
    env["GLM5_CONFIG_DIR"] = str(run / "config")
    try:
        threads = int(json.loads((run / "proof.json").read_text()).get("threads") or 0)
    except (OSError, ValueError):
        threads = 0
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        env.pop("GLM5_AUTO_THREADS", None)
    env.update(extra or {})
    return env


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when the driver dies, even by SIGKILL, so a killed proof leaves no training
    run or server behind to race the resumed one. (Used only where the driver runs no other thread.)"""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_logged(argv: list[str], log: Path, env: dict[str, str] | None = None, *, threads: bool = False,
               cwd: Path | None = None) -> None:  # fmt: skip
    """Run argv with its output appended to log; StageFailed (naming the log's tail) when it fails. `threads`:
    the driver runs another thread now (the expert endpoint), so no pre-exec hook (it could deadlock). `cwd`:
    the run folder, so what a command keeps in its working folder (the bench's .glm5-bench-cache) stays there."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ {' '.join(argv)}\n")
        f.flush()
        hook = None if threads or sys.platform != "linux" else _die_with_parent
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            preexec_fn=hook, cwd=cwd).returncode  # fmt: skip
    if rc != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-8:])
        raise StageFailed(f"`{shown(argv)}` exited with {rc} (log: {log}):\n{tail}")


def spec_metrics(text: str) -> dict[str, float]:
    """The glm5:spec_* gauges and counters of a Prometheus /metrics page."""
    return {m.group(1).removeprefix("glm5:"): float(m.group(2)) for m in _METRIC.finditer(text)}


def serve_and_bench(run: Path, stage: str, c: ProofConfig, log: Callable[[str], None] = print,
                    startup_s: float = 900.0, model: Path | None = None, lora: Path | None = None) -> dict:  # fmt: skip
    """Serve RUN/models/<stage> (or `model` with the LoRA adapter `lora`: an RL step's), bench held-out against
    it into RUN/bench/<stage>; the server's counters (also written to disk)."""
    model = model if model is not None else model_dir(run, stage)
    key, port = secrets.token_hex(16), free_port()
    url = f"http://127.0.0.1:{port}"
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    serve_log = open(logs / f"serve-{stage}.log", "a", encoding="utf-8")
    argv = serve_cmd(model, port, c, key, lora)
    serve_log.write(f"\n$ {' '.join(argv)}\n")
    serve_log.flush()
    proc = subprocess.Popen(argv, stdout=serve_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=child_env(run), preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                            cwd=run)  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise StageFailed(f"glm5 serve {model} exited with {proc.returncode} "
                                  f"(log: {logs / f'serve-{stage}.log'})")  # fmt: skip
            try:
                if httpx.get(f"{url}/health", headers=headers, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise StageFailed(f"glm5 serve did not become healthy in {startup_s:.0f} s ({serve_log.name})")
            time.sleep(1.0)
        log(f"serving {stage} at {url}/v1 (INT4 {c.quant == 'int4'}, speculative {c.speculative})")
        run_logged(bench_cmd(run, stage, c, f"{url}/v1", KEY_ENV), logs / f"bench-{stage}.log",
                   child_env(run, {KEY_ENV: key}), cwd=run)  # fmt: skip
        counters = spec_metrics(httpx.get(f"{url}/metrics", headers=headers, timeout=30).text)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        serve_log.close()
    out = run / "bench" / f"{stage}.serve.json"
    served = {"model": str(model), "lora": str(lora) if lora is not None else None}
    out.write_text(json.dumps({"stage": stage, **served, "quant": c.quant, "speculative": c.speculative, **counters},
                              indent=1))  # fmt: skip
    return counters
