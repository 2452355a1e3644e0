"""The run folder is the record of a run; everything else (reports, JUnit, merges) is derived from it.

    RUN/config.json     what the run is: kind, agent, k, tasks (ids + digest), environment, limits, shard
    RUN/results.jsonl   one line per finished trial try, appended and fsynced; the last line for an
                        (instance_id, attempt) is its result
    RUN/trials/<instance>/<attempt>/   each trial's folder (agent/bench/trial.py)
    RUN/report.json, RUN/junit.xml, RUN/summary.md   regenerated from the above
    RUN/.lock           held while a runner works here: two runners on one folder would double trials

Resuming: a trial whose result is in results.jsonl is kept; one that was in flight (a folder, no line) reruns
from scratch; an infra error reruns while tries remain. A kill -9 loses at most the trials in flight: a line is
whole or, torn, ignored (and that trial reruns). Keys that change results refuse to resume unless --force.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any

from agent.bench.trial import write_json

# config keys whose change changes the results; the rest (concurrency, outputs, retries) may change on resume
RESULT_KEYS = ("kind", "agent", "k", "tasks_digest", "env", "limits", "flaky_reruns", "test_timeout_s")


class RunFolderError(ValueError):
    """The folder belongs to another run (or is in use); the message says which keys differ and what to do."""


class RunFolder:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.trials = self.path / "trials"
        self.results_path = self.path / "results.jsonl"
        self._lock = threading.Lock()
        self._lockfile: Any = None

    # -- config ----------------------------------------------------------------------------------------------

    def config(self) -> dict[str, Any] | None:
        p = self.path / "config.json"
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise RunFolderError(f"{p}: not valid JSON ({e}); move the folder away or pass a new --out") from None

    def open(self, config: dict[str, Any], force: bool = False) -> None:
        """Claim the folder for `config`: new, or the same run resumed (or --force)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lockfile = open(self.path / ".lock", "w")  # noqa: SIM115 - held for the run's life
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderError(f"{self.path} is in use by another glm5 bench run") from None
        try:
            self._check(config, force)
        except RunFolderError:
            self.close()
            raise
        write_json(self.path / "config.json", config)
        self.trials.mkdir(exist_ok=True)

    def _check(self, config: dict[str, Any], force: bool) -> None:
        old = self.config()
        if old is not None and not force:
            diff = [k for k in RESULT_KEYS if old.get(k) != config.get(k)]
            if diff:
                detail = "; ".join(f"{k}: {_short(old.get(k))} -> {_short(config.get(k))}" for k in diff)
                raise RunFolderError(
                    f"{self.path} holds a run with a different {', '.join(diff)} ({detail}); its results would not "
                    "be comparable. Use a new --out, or --force to continue anyway"
                )

    def close(self) -> None:
        if self._lockfile is not None:
            self._lockfile.close()
            self._lockfile = None

    # -- results ---------------------------------------------------------------------------------------------

    def append(self, result: dict[str, Any]) -> None:
        line = json.dumps(result, ensure_ascii=False, default=str) + "\n"
        with self._lock, open(self.results_path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def lines(self) -> list[dict[str, Any]]:
        return read_results(self.results_path)

    def trial_dir(self, instance_id: str, attempt: int, try_: int = 1) -> Path:
        # a retry gets its own folder so the failed try stays on the record
        return self.trials / instance_id / (str(attempt) if try_ == 1 else f"{attempt}.try{try_}")


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a results.jsonl (a torn last line, from a kill mid-write, is skipped)."""
    out = []
    if not Path(path).exists():
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except (ValueError, RecursionError):  # torn, or built to crash a parser (nesting, huge numbers)
                continue
            if _is_result(r):
                out.append(r)
    return out


def _is_result(r: Any) -> bool:
    """A line the run's readers can use: a dict with an instance id, an attempt number and a status."""
    try:
        return (isinstance(r, dict) and isinstance(r.get("instance_id"), str) and isinstance(r.get("status"), str)
                and 0 <= int(r.get("attempt")) < 10**6)  # fmt: skip
    except (TypeError, ValueError, OverflowError):
        return False


def final_results(lines: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(instance_id, attempt) -> its result: the last try, preferring a graded one over an infra error."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in lines:
        key = (r["instance_id"], int(r["attempt"]))
        old = out.get(key)
        if old is None or r["status"] != "infra_error" or old["status"] == "infra_error":
            out[key] = r
    return out


def tries(lines: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    n: dict[tuple[str, int], int] = {}
    for r in lines:
        key = (r["instance_id"], int(r["attempt"]))
        n[key] = n.get(key, 0) + 1
    return n


def _short(v: Any) -> str:
    s = json.dumps(v, default=str, sort_keys=True)
    return s if len(s) <= 80 else s[:77] + "..."
