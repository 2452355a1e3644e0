"""Checks /app/answer.txt (the value of `key` at the crash) and the fixed /app/ledger.py: its checksum of the shipped
ledger and of two others, run with plain Python."""

import json
import subprocess
import sys
import time
from pathlib import Path

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def test_key_at_the_crash():
    answer = Path("/app/answer.txt")
    assert answer.is_file(), "/app/answer.txt does not exist"
    assert answer.read_text().strip() == "312664", f"wrong value of key: {answer.read_text().strip()[:40]!r}"


@check
def test_ledger_prints_its_checksum():
    r = subprocess.run([sys.executable, "/app/ledger.py"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"ledger.py failed: {r.stderr[-500:]}"
    assert r.stdout.strip() == "checksum: 860644", f"printed {r.stdout.strip()[:200]!r}"


@check
def test_checksum_of_other_ledgers():
    code = "import sys; sys.path.insert(0, '/app'); import ledger; print(ledger.checksum(list(range(1, 11))), " \
           "ledger.checksum([10, 20, 30]), ledger.checksum([561, 793, 257, 334, 688, 281, 475, 296, 837, 513, " \
           "663, 690, 817, 366, 357]))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd="/tmp")
    assert r.returncode == 0, f"checksum() failed: {r.stderr[-500:]}"
    assert r.stdout.split() == ["1954", "3215", "413423"], f"got {r.stdout.strip()[:200]!r}"


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
