#!/bin/bash
# Reference solution: the package plus a __main__.py that passes main's return value to sys.exit (zipapp's own
# --main would drop it), zipped with the standard library's zipapp.
set -euo pipefail
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r /app/src/wordstat "$stage/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
printf 'import sys\n\nfrom wordstat.cli import main\n\nsys.exit(main())\n' > "$stage/__main__.py"
mkdir -p /app/dist
python3 -m zipapp "$stage" --python "/usr/bin/env python3" --output /app/dist/wordstat.pyz
