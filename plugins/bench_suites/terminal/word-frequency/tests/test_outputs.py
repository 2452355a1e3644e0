"""Checks /app/top_words.txt against the counts of the book as it was shipped (the agent cannot change them)."""

import sys
from pathlib import Path

EXPECTED = ["41 the", "11 and", "10 was", "9 he", "8 keeper", "7 a", "7 in", "6 kept", "6 light", "6 log"]


def main() -> int:
    path = Path("/app/top_words.txt")
    if not path.is_file():
        print("FAIL: /app/top_words.txt does not exist")
        return 1
    lines = path.read_text().splitlines()
    if lines != EXPECTED:
        print("FAIL: expected", EXPECTED, "got", lines[:12])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
