"""Checks /app/summary.json: paid orders per customer from the orders.csv that the task shipped."""

import json
import sys
from pathlib import Path

EXPECTED = {
    "Ada Lovelace": {"paid_orders": 3, "total": 23.10},
    "Hopper, Grace": {"paid_orders": 3, "total": 50.00},
    "Alan Turing": {"paid_orders": 2, "total": 8.00},
}


def main() -> int:
    path = Path("/app/summary.json")
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"FAIL: cannot read {path} as JSON: {e}")
        return 1
    if not isinstance(got, dict) or set(got) != set(EXPECTED):
        print("FAIL: expected customers", sorted(EXPECTED), "got", sorted(got) if isinstance(got, dict) else got)
        return 1
    ok = True
    for name, want in EXPECTED.items():
        have = got[name]
        if not isinstance(have, dict) or set(have) != {"paid_orders", "total"}:
            print(f"FAIL: {name}: expected the keys paid_orders and total, got {have!r}")
            ok = False
            continue
        count, total = have["paid_orders"], have["total"]
        if type(count) is not int or count != want["paid_orders"]:
            print(f"FAIL: {name}: paid_orders {count!r}, expected {want['paid_orders']}")
            ok = False
        # half a cent: the value must round to the right two decimals, whatever float noise it carries
        if not isinstance(total, (int, float)) or isinstance(total, bool) or abs(total - want["total"]) >= 0.005:
            print(f"FAIL: {name}: total {total!r}, expected {want['total']}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
