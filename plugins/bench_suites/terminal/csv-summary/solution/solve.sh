#!/bin/bash
# Reference solution: the csv module (quoted fields), case-insensitive status, amounts summed as decimals.
set -euo pipefail
python3 - <<'PY'
import csv
import json
from decimal import Decimal

summary = {}
with open("/app/orders.csv", newline="") as f:
    for row in csv.DictReader(f):
        if row["status"].strip().lower() != "paid":
            continue
        entry = summary.setdefault(row["customer"], {"paid_orders": 0, "total": Decimal(0)})
        entry["paid_orders"] += 1
        entry["total"] += Decimal(row["amount"])
for entry in summary.values():
    entry["total"] = float(round(entry["total"], 2))
with open("/app/summary.json", "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
    f.write("\n")
PY
