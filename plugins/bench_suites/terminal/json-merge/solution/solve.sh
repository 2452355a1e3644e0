#!/bin/bash
# Reference solution: a recursive merge in Python.
set -euo pipefail
python3 - <<'PY'
import json


def merge(base, override):
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


with open("/app/config/base.json") as f:
    base = json.load(f)
with open("/app/config/production.json") as f:
    production = json.load(f)
with open("/app/config/merged.json", "w") as f:
    json.dump(merge(base, production), f, indent=2)
    f.write("\n")
PY
