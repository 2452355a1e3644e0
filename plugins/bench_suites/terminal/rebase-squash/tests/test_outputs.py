"""Checks /app/repo after the squash: two commits, the first the one it started with, the second "Add number
parsing" committed by Dev with the files as they were, no rebase in progress, a clean work tree."""

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path("/app/repo")
BASE = "@BASE@"
PARSE = """from tokens import tokens


def numbers(text):
    return [int(t) for t in tokens(text) if t.lstrip("-").isdigit()]
"""
TOKENS = """def tokens(text):
    return text.split()
"""
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def git(*args: str) -> str:
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, f"git {' '.join(args)} failed: {r.stderr.strip()[:300]}"
    return r.stdout


@check
def test_no_rebase_in_progress():
    gitdir = Path(git("rev-parse", "--absolute-git-dir").strip())
    assert not (gitdir / "rebase-merge").exists() and not (gitdir / "rebase-apply").exists(), "a rebase is in progress"


@check
def test_two_commits_the_first_unchanged():
    shas = git("rev-list", "main").split()
    assert len(shas) == 2, f"main has {len(shas)} commits, expected 2"
    assert shas[1] == BASE, "the first commit (Add the tokenizer) was changed"


@check
def test_the_squashed_commit():
    subject, body, committer = git("log", "-1", "--format=%s%n%b%n%cn <%ce>", "main").split("\n", 2)
    assert subject == "Add number parsing" and not body.strip(), f"message {subject!r} / {body.strip()[:80]!r}"
    assert committer.strip() == "Dev <dev@example.com>", f"committed by {committer.strip()!r}"


@check
def test_files_as_they_were_and_clean():
    assert git("show", "main:parse.py") == PARSE, "parse.py changed"
    assert git("show", "main:tokens.py") == TOKENS, "tokens.py changed"
    assert git("ls-tree", "--name-only", "main").split() == ["parse.py", "tokens.py"]
    assert git("status", "--porcelain") == "", "the work tree is not clean"


# -- the runner: every check in order, a CTRF report beside the reward (as Harbor's template writes one) --------


def main() -> int:
    results, start = [], int(time.time() * 1000)
    for fn in CHECKS:
        t0 = time.monotonic()
        try:
            fn()
            status, message = "passed", ""
        except AssertionError as e:
            status, message = "failed", str(e)
        except Exception as e:  # the agent left /app in a state no check expected: a failure, not a crash
            status, message = "failed", f"{type(e).__name__}: {e}"
        ms = int((time.monotonic() - t0) * 1000)
        results.append(
            {"name": fn.__name__, "status": status, "duration": ms, **({"message": message} if message else {})}
        )
        print(f"{status.upper()} {fn.__name__}" + (f": {message}" if message else ""))
    passed = sum(r["status"] == "passed" for r in results)
    summary = {"tests": len(results), "passed": passed, "failed": len(results) - passed, "pending": 0, "skipped": 0}
    report = {"results": {"tool": {"name": "glm5-builtin-verifier"}, "summary": {**summary, "other": 0, "start": start,
              "stop": int(time.time() * 1000)}, "tests": results}}  # fmt: skip
    Path("/logs/verifier").mkdir(parents=True, exist_ok=True)
    Path("/logs/verifier/ctrf.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
