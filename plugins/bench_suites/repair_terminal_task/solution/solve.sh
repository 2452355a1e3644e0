#!/bin/bash
# Reference solution: the one-line fix the issue describes (fix.diff is the SWE-format row's gold patch).
set -euo pipefail
cd /app
git apply /solution/fix.diff
