"""Checks /app/app.conf as the installer writes it for the answers asked for, and that the installer is unchanged."""

import hashlib
import json
import sys
import time
from pathlib import Path

CONF = Path("/app/app.conf")
INSTALLER_SHA256 = "@SHA256:install.py@"
EXPECTED = ["name = orchard-api", "database = postgres", "port = 5433", "install_id = 8bc3e9f72bc3309f"]
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def test_installer_unchanged():
    got = hashlib.sha256(Path("/app/install.py").read_bytes()).hexdigest()
    assert got == INSTALLER_SHA256, "/app/install.py was changed"


@check
def test_configuration_written():
    assert CONF.is_file(), "/app/app.conf does not exist"
    got = CONF.read_text().splitlines()
    assert got == EXPECTED, f"expected {EXPECTED}, got {got[:8]}"


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
