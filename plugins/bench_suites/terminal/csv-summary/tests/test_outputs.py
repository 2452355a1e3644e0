"""Checks /app/summary.json: paid orders per customer from the orders.csv that the task shipped."""

import json
import sys
import time
from pathlib import Path

OUT = Path("/app/summary.json")
EXPECTED = {
    "Ada Lovelace": {"paid_orders": 3, "total": 23.10},
    "Hopper, Grace": {"paid_orders": 3, "total": 50.00},
    "Alan Turing": {"paid_orders": 2, "total": 8.00},
}
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def summary() -> dict:
    got = json.loads(OUT.read_text())
    assert isinstance(got, dict), f"summary.json holds a {type(got).__name__}, not an object"
    return got


@check
def test_customers_with_paid_orders():
    assert sorted(summary()) == sorted(EXPECTED), f"customers {sorted(summary())}, expected {sorted(EXPECTED)}"


@check
def test_paid_order_counts():
    got = summary()
    for name, want in EXPECTED.items():
        have = got.get(name, {}).get("paid_orders")
        assert type(have) is int and have == want["paid_orders"], (
            f"{name}: paid_orders {have!r}, expected {want['paid_orders']}"
        )


@check
def test_totals():
    got = summary()
    for name, want in EXPECTED.items():
        total = got.get(name, {}).get("total")
        # half a cent: the value must round to the right two decimals, whatever float noise it carries
        ok = isinstance(total, (int, float)) and not isinstance(total, bool) and abs(total - want["total"]) < 0.005
        assert ok, f"{name}: total {total!r}, expected {want['total']}"


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
