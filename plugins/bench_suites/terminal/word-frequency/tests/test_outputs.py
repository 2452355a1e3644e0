"""Checks /app/top_words.txt against the counts of the book as it was shipped (the agent cannot change them)."""

import json
import sys
import time
from pathlib import Path

OUT = Path("/app/top_words.txt")
EXPECTED = ["41 the", "11 and", "10 was", "9 he", "8 keeper", "7 a", "7 in", "6 kept", "6 light", "6 log"]
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def lines() -> list[str]:
    assert OUT.is_file(), "/app/top_words.txt does not exist"
    return OUT.read_text().splitlines()


@check
def test_ten_lines():
    assert len(lines()) == 10, f"{len(lines())} lines, expected 10"


@check
def test_words_and_counts():
    got = lines()
    assert got == EXPECTED, f"expected {EXPECTED}, got {got[:12]}"


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
