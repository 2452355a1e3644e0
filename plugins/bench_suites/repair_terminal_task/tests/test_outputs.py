"""Runs the package's tests against /app: the test files as the SWE-format row grades them (cases/, the hidden case
included), never /app/tests, so an agent that edits the tests changes nothing here.

Each `test_*` function is one check, named by its pytest node id (`tests/test_<module>.py::test_<f>`), as the row's
FAIL_TO_PASS and PASS_TO_PASS name it. Plain Python rather than pytest: the verifier needs only python3. A check
that runs past LIMIT_S fails, so an endless loop the agent wrote scores 0 instead of timing the verifier out.
"""

import ast
import importlib.util
import json
import signal
import sys
import time
import traceback
from pathlib import Path

APP = Path("/app")
CASES = Path(__file__).resolve().parent / "cases"
LIMIT_S = 10


class TooSlow(Exception):
    pass


def _alarm(signum, frame):
    raise TooSlow(f"ran longer than {LIMIT_S}s")


def load(path: Path):
    """The module's test functions by name, or the error that kept it from importing (the agent broke the
    package): then every test of the file fails with that error."""
    names = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)
             and n.name.startswith("test_")]  # fmt: skip
    try:
        spec = importlib.util.spec_from_file_location(f"glm5_cases_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # SystemExit: a package that exits on import must not end the run with 0
        return names, f"{type(e).__name__} importing {path.name}: {e}"
    return names, module


def run_one(fn) -> tuple[str, str]:
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        fn()
        return "passed", ""
    except AssertionError as e:  # a bare `assert`: its source line says what was expected
        return "failed", str(e) or traceback.extract_tb(e.__traceback__)[-1].line or "assertion failed"
    except (Exception, SystemExit) as e:
        return "failed", f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)


def main() -> int:
    sys.path.insert(0, str(APP))  # the package as the agent left it
    results, start = [], int(time.time() * 1000)
    for path in sorted(CASES.glob("test_*.py")):
        names, module = load(path)
        for name in names:
            t0 = time.monotonic()
            status, message = ("failed", module) if isinstance(module, str) else run_one(getattr(module, name))
            ms = int((time.monotonic() - t0) * 1000)
            node = f"tests/{path.name}::{name}"
            results.append(
                {"name": node, "status": status, "duration": ms, **({"message": message} if message else {})}
            )
            print(f"{status.upper()} {node}" + (f": {message}" if message else ""))
    passed = sum(r["status"] == "passed" for r in results)
    summary = {"tests": len(results), "passed": passed, "failed": len(results) - passed, "pending": 0, "skipped": 0}
    report = {"results": {"tool": {"name": "glm5-repair-verifier"}, "summary": {**summary, "other": 0, "start": start,
              "stop": int(time.time() * 1000)}, "tests": results}}  # fmt: skip
    Path("/logs/verifier").mkdir(parents=True, exist_ok=True)
    Path("/logs/verifier/ctrf.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if results and passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
