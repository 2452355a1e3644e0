"""Checks /app/first_bad.txt against the commit that broke the check, and that main was left where it was."""

import json
import subprocess
import sys
import time
from pathlib import Path

FIRST_BAD = "@FIRST_BAD@"
HEAD = "@HEAD@"
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def test_first_bad_commit():
    path = Path("/app/first_bad.txt")
    answer = path.read_text().strip() if path.is_file() else None
    assert answer == FIRST_BAD, f"/app/first_bad.txt holds {answer!r}, not the first bad commit"


@check
def test_main_is_unchanged():
    p = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", "/app/repo", "rev-parse", "refs/heads/main"],
        capture_output=True,
        text=True,
    )
    assert p.stdout.strip() == HEAD, f"main now points at {p.stdout.strip() or p.stderr.strip()!r}, not where it was"


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
