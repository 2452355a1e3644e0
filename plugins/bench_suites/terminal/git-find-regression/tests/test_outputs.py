"""Checks /app/first_bad.txt against the commit that broke the check, and that main was left where it was."""

import subprocess
import sys
from pathlib import Path

FIRST_BAD = "@FIRST_BAD@"
HEAD = "@HEAD@"


def main() -> int:
    ok = True
    path = Path("/app/first_bad.txt")
    answer = path.read_text().strip() if path.is_file() else None
    if answer != FIRST_BAD:
        print(f"FAIL: /app/first_bad.txt holds {answer!r}, expected the first bad commit")
        ok = False
    p = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", "/app/repo", "rev-parse", "refs/heads/main"],
        capture_output=True,
        text=True,
    )
    if p.stdout.strip() != HEAD:
        print(f"FAIL: main now points at {p.stdout.strip() or p.stderr.strip()!r}, not where it was")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
