"""Checks /app/errors.txt against the 5xx counts of the logs the task shipped."""

import sys
from pathlib import Path

EXPECTED = ["11 /search", "8 /api/users", "7 /api/export"]


def main() -> int:
    path = Path("/app/errors.txt")
    if not path.is_file():
        print("FAIL: /app/errors.txt does not exist")
        return 1
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if lines != EXPECTED:
        print("FAIL: expected", EXPECTED, "got", lines[:5])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
