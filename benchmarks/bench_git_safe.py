"""What the host-side git fence costs: a checkpoint-style `git add -A` + `write-tree` through agent.git_safe
(one extra `git config --list` per call) against plain git, on a throwaway repository. Prints the ratio."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from agent.git_safe import git


def main(n: int = 20, files: int = 200) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        for i in range(files):
            (repo / f"f{i}.txt").write_text(f"{i}\n")
        index = str(repo / "bench-index")
        env = {**os.environ, "GIT_INDEX_FILE": index}

        def plain() -> None:
            subprocess.run(["git", "-C", str(repo), "add", "-A"], env=env, check=True, capture_output=True)
            subprocess.run(["git", "-C", str(repo), "write-tree"], env=env, check=True, capture_output=True)

        def safe() -> None:
            git(repo, "add", "-A", env={"GIT_INDEX_FILE": index})
            git(repo, "write-tree", env={"GIT_INDEX_FILE": index})

        plain(), safe()  # warm the stat cache
        times = {}
        for name, fn in (("plain", plain), ("safe", safe)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name] = (time.perf_counter() - t0) / n
        print(f"plain git {times['plain'] * 1e3:.1f} ms, git_safe {times['safe'] * 1e3:.1f} ms per snapshot; "
              f"ratio {times['safe'] / times['plain']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
