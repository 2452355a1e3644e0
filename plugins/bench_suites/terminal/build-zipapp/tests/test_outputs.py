"""Checks /app/dist/wordstat.pyz: runs from another folder, without /app/src, directly and through python3."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYZ = Path("/app/dist/wordstat.pyz")
SAMPLE = "one two three\nfour five\n\nsix\n"
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def run(argv_of, *args):
    """Run a copy of the archive in a fresh folder with no PYTHONPATH: /app/src cannot be reached."""
    assert PYZ.is_file(), f"{PYZ} does not exist"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "wordstat.pyz"
        shutil.copy2(PYZ, copy)
        sample = Path(tmp) / "sample.txt"
        sample.write_text(SAMPLE)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp}
        argv = [*argv_of(copy), *(str(sample) if a == "SAMPLE" else a for a in args)]
        p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=30)
        return p, str(sample)


@check
def test_runs_with_python3():
    p, sample = run(lambda pyz: [sys.executable, "-I", str(pyz)], "SAMPLE")
    want = f"4 6 29 {sample}\n"
    assert p.returncode == 0 and p.stdout == want, (
        f"exit {p.returncode}, stdout {p.stdout!r} (expected {want!r}), stderr {p.stderr[-300:]!r}"
    )


@check
def test_runs_directly():
    p, sample = run(lambda pyz: [str(pyz)], "SAMPLE")
    want = f"4 6 29 {sample}\n"
    assert p.returncode == 0 and p.stdout == want, (
        f"exit {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr[-300:]!r}"
    )


@check
def test_exit_status_is_mains():
    p, _ = run(lambda pyz: [sys.executable, "-I", str(pyz)])
    assert p.returncode == 2, (
        f"without a FILE argument the exit status is {p.returncode}, expected 2 (what main returns)"
    )


# -- the runner: every check in order, a CTRF report beside the reward (as Harbor's template writes one) --------


def main() -> int:
    results, start = [], int(time.time() * 1000)
    for fn in CHECKS:
        t0 = time.monotonic()
        try:
            fn()
            status, message = "passed", ""
        except AssertionError as e:
            status, message = "failed", str(e)
        except Exception as e:  # the agent left /app in a state no check expected: a failure, not a crash
            status, message = "failed", f"{type(e).__name__}: {e}"
        ms = int((time.monotonic() - t0) * 1000)
        results.append(
            {"name": fn.__name__, "status": status, "duration": ms, **({"message": message} if message else {})}
        )
        print(f"{status.upper()} {fn.__name__}" + (f": {message}" if message else ""))
    passed = sum(r["status"] == "passed" for r in results)
    summary = {"tests": len(results), "passed": passed, "failed": len(results) - passed, "pending": 0, "skipped": 0}
    report = {"results": {"tool": {"name": "glm5-builtin-verifier"}, "summary": {**summary, "other": 0, "start": start,
              "stop": int(time.time() * 1000)}, "tests": results}}  # fmt: skip
    Path("/logs/verifier").mkdir(parents=True, exist_ok=True)
    Path("/logs/verifier/ctrf.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
