"""Checks /app/config/merged.json, and that the two inputs were left as they were."""

import hashlib
import json
import sys
import time
from pathlib import Path

CONFIG = Path("/app/config")
EXPECTED = {
    "service": "orders",
    "port": 8080,
    "debug": False,
    "database": {
        "host": "db.internal",
        "port": 5432,
        "pool": {"min": 1, "max": 50},
        "options": ["sslmode=require", "connect_timeout=5"],
    },
    "features": {"search": True, "exports": True},
    "admins": ["ops"],
    "region": "eu-west-1",
}
INPUTS = {"base.json": "@SHA256:config/base.json@", "production.json": "@SHA256:config/production.json@"}
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def merged() -> dict:
    return json.loads((CONFIG / "merged.json").read_text())


@check
def test_inputs_unchanged():
    for name, digest in INPUTS.items():
        path = CONFIG / name
        assert path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{path} was changed"


@check
def test_nested_objects_merge():
    got = merged()
    assert got.get("database", {}).get("pool") == EXPECTED["database"]["pool"], (
        f"database.pool is {got.get('database', {}).get('pool')!r}"
    )
    assert got.get("database", {}).get("port") == 5432, "database.port from base.json is lost"


@check
def test_arrays_are_replaced():
    got = merged()
    assert got.get("admins") == ["ops"], f"admins is {got.get('admins')!r}"
    assert got.get("database", {}).get("options") == EXPECTED["database"]["options"], "database.options not replaced"


@check
def test_null_removes_the_key():
    assert "beta_checkout" not in merged().get("features", {}), "features.beta_checkout should be gone"


@check
def test_whole_result():
    got = merged()
    assert got == EXPECTED, f"merged.json is {json.dumps(got, sort_keys=True)}"


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
