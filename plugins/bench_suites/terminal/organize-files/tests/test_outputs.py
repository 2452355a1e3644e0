"""Checks /app after the organize-files task: the exact tree and contents expected, nothing else."""

import hashlib
import sys
from pathlib import Path

EXPECTED = {
    "txt/draft.txt": "Quarterly report draft\n- revenue up\n- costs flat\n",
    "txt/todo.TXT": "buy milk\ncall the plumber\n",
    "csv/data.csv": "id,value\n1,10\n2,20\n",
    "jpg/photo.JPG": "not really a jpeg, just bytes\n",
    "gz/backup.tar.gz": "pretend this is a tarball\n",
    "other/README": "Read me first.\n",
    "md/user guide.md": "# Guide\n\nSteps.\n",
}


def main() -> int:
    inbox, sorted_dir = Path("/app/inbox"), Path("/app/sorted")
    problems = []
    if not inbox.is_dir():
        problems.append("/app/inbox is gone")
    elif any(inbox.iterdir()):
        problems.append(f"/app/inbox is not empty: {sorted(p.name for p in inbox.iterdir())}")
    found = (
        {p.relative_to(sorted_dir).as_posix() for p in sorted_dir.rglob("*") if not p.is_dir()}
        if sorted_dir.is_dir()
        else set()
    )
    for rel in sorted(set(EXPECTED) - found):
        problems.append(f"missing /app/sorted/{rel}")
    for rel in sorted(found - set(EXPECTED)):
        problems.append(f"unexpected /app/sorted/{rel}")
    for rel in sorted(found & set(EXPECTED)):
        data = (sorted_dir / rel).read_bytes()
        if hashlib.sha256(data).digest() != hashlib.sha256(EXPECTED[rel].encode()).digest():
            problems.append(f"/app/sorted/{rel} has the wrong content")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
