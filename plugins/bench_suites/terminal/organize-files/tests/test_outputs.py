"""Checks /app after the organize-files task: the exact tree and contents expected, nothing else."""

import hashlib
import json
import sys
import time
from pathlib import Path

INBOX, SORTED = Path("/app/inbox"), Path("/app/sorted")
EXPECTED = {
    "txt/draft.txt": "Quarterly report draft\n- revenue up\n- costs flat\n",
    "txt/todo.TXT": "buy milk\ncall the plumber\n",
    "csv/data.csv": "id,value\n1,10\n2,20\n",
    "jpg/photo.JPG": "not really a jpeg, just bytes\n",
    "gz/backup.tar.gz": "pretend this is a tarball\n",
    "other/README": "Read me first.\n",
    "md/user guide.md": "# Guide\n\nSteps.\n",
}
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def found() -> set[str]:
    if not SORTED.is_dir():
        return set()
    return {p.relative_to(SORTED).as_posix() for p in SORTED.rglob("*") if not p.is_dir()}


@check
def test_inbox_is_empty():
    assert INBOX.is_dir(), "/app/inbox is gone"
    left = sorted(p.name for p in INBOX.iterdir())
    assert not left, f"/app/inbox still holds {left}"


@check
def test_every_kept_file_is_sorted():
    missing = sorted(set(EXPECTED) - found())
    assert not missing, f"missing under /app/sorted: {missing}"


@check
def test_duplicates_and_strays_are_gone():
    extra = sorted(found() - set(EXPECTED))
    assert not extra, f"unexpected under /app/sorted: {extra}"


@check
def test_contents_are_unchanged():
    for rel in sorted(found() & set(EXPECTED)):
        data = (SORTED / rel).read_bytes()
        assert hashlib.sha256(data).digest() == hashlib.sha256(EXPECTED[rel].encode()).digest(), f"{rel} changed"


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
