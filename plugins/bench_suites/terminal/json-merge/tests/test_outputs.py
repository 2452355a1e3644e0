"""Checks /app/config/merged.json, and that the two inputs were left as they were."""

import hashlib
import json
import sys
from pathlib import Path

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


def main() -> int:
    config = Path("/app/config")
    ok = True
    for name, digest in INPUTS.items():
        path = config / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            print(f"FAIL: {path} was changed")
            ok = False
    try:
        got = json.loads((config / "merged.json").read_text())
    except (OSError, ValueError) as e:
        print(f"FAIL: cannot read merged.json: {e}")
        return 1
    if got != EXPECTED:
        print("FAIL: merged.json is", json.dumps(got, sort_keys=True))
        print("      expected     ", json.dumps(EXPECTED, sort_keys=True))
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
