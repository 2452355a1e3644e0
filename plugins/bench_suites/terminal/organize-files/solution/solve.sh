#!/bin/bash
# Reference solution: in byte order of names, keep the first file of each content and move it into
# /app/sorted/<ext>/; later files with the same content are deleted.
set -euo pipefail
cd /app/inbox
export LC_ALL=C
declare -A seen
while IFS= read -r -d '' f; do
    sum=$(sha256sum -- "$f" | cut -d' ' -f1)
    if [[ -n "${seen[$sum]:-}" ]]; then
        rm -- "$f"
        continue
    fi
    seen[$sum]=1
    if [[ "$f" == *.* ]]; then ext=$(printf '%s' "${f##*.}" | tr '[:upper:]' '[:lower:]'); else ext=other; fi
    mkdir -p "/app/sorted/$ext"
    mv -- "$f" "/app/sorted/$ext/"
done < <(find . -maxdepth 1 -type f -printf '%f\0' | sort -z)
