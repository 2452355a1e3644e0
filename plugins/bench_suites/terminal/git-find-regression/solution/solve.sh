#!/bin/bash
# Reference solution: let git bisect run the check between v1.0 (good) and main (bad).
set -euo pipefail
cd /app/repo
git bisect start main v1.0 >/dev/null
git bisect run python3 check.py >/dev/null
git rev-parse refs/bisect/bad > /app/first_bad.txt
git bisect reset >/dev/null
