"""Checks /app/dist/wordstat.pyz: runs from another folder, without /app/src, directly and through python3."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PYZ = Path("/app/dist/wordstat.pyz")


def main() -> int:
    if not PYZ.is_file():
        print(f"FAIL: {PYZ} does not exist")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        copy = work / "wordstat.pyz"
        shutil.copy2(PYZ, copy)
        sample = work / "sample.txt"
        sample.write_text("one two three\nfour five\n\nsix\n")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp}  # no PYTHONPATH: /app/src is not reachable
        runs = {
            "python3": [sys.executable, "-I", str(copy), str(sample)],
            "direct": [str(copy), str(sample)],
        }
        for name, argv in runs.items():
            try:
                p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=30)
            except OSError as e:
                print(f"FAIL ({name}): cannot run {argv[0]}: {e}")
                return 1
            want = f"4 6 29 {sample}\n"
            if p.returncode != 0 or p.stdout != want:
                print(
                    f"FAIL ({name}): exit {p.returncode}, stdout {p.stdout!r} (expected {want!r}), stderr {p.stderr[-300:]!r}"
                )
                return 1
        p = subprocess.run(
            [sys.executable, "-I", str(copy)], cwd=tmp, env=env, capture_output=True, text=True, timeout=30
        )
        if p.returncode != 2:
            print(f"FAIL: without a FILE argument the exit status is {p.returncode}, expected 2 (what main returns)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
