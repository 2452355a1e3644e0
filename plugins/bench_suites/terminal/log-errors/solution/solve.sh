#!/bin/bash
# Reference solution: match the request and status fields, keep 5xx, strip the query, count, sort.
set -euo pipefail
export LC_ALL=C
cat /app/logs/access.log.1 /app/logs/access.log \
    | sed -nE 's/^[^ ]+ [^ ]+ [^ ]+ \[[^]]*\] "[A-Z]+ ([^ "?]+)[^ "]* [^"]*" (5[0-9][0-9]) [^ ]+$/\1/p' \
    | sort | uniq -c | sort -k1,1nr -k2,2 | head -n 3 | awk '{print $1, $2}' > /app/errors.txt
