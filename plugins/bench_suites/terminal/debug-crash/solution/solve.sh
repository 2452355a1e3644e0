#!/bin/bash
# Reference solution: continue to the crash in pdb's post-mortem, print `key` there, then guard the zero weight.
set -euo pipefail
cd /app
out=$(printf 'continue\np key\nquit\n' | python3 -m pdb ledger.py 2>&1 || true)
key=$(printf '%s\n' "$out" | grep -oE '^\(Pdb\) [0-9]+$' | head -n1 | grep -oE '[0-9]+')
echo "$key" > answer.txt
python3 - <<'PY'
from pathlib import Path
p = Path("/app/ledger.py")
src = p.read_text()
p.write_text(src.replace("        weight = key % 89 - 7\n", "        weight = key % 89 - 7 or 1\n"))
PY
python3 ledger.py
