#!/bin/bash
# Reference solution: split on non-letters, lower-case, count, sort by count (descending) then word.
set -euo pipefail
export LC_ALL=C
tr -cs 'A-Za-z' '\n' < /app/book.txt | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c \
    | sort -k1,1nr -k2,2 | head -n 10 | awk '{print $1, $2}' > /app/top_words.txt
