"""The built-in Harbor / Terminal-Bench 2.0 suite: task folders that need only coreutils, git and Python.

Data (plugins/bench_suites/):
    terminal/<task>/               a Harbor task folder as it is shipped: task.toml (schema 1.4), instruction.md,
                                   environment/ (what /app starts with: its files, and a Dockerfile that copies
                                   them to /app for Docker users), tests/test.sh (+ test_outputs.py),
                                   solution/solve.sh
    terminal_repos/<task>.toml     a git repository that /app starts with, built at materialize into
                                   environment/<path> (git cannot ship a .git folder as package data)

`materialize(dest)` copies each task folder to dest/<task>/ with fixed modes (scripts 0755, the rest 0644),
builds its repository, and fills placeholders in tests/ so checks can name what the build made:
@HEAD@ and @<MARK>@ (the SHAs of main and of a marked commit) and @SHA256:<path>@ (the digest of
environment/<path>). The verifier writes 1 or 0 to /logs/verifier/reward.txt; tests and solution are
outside environment/, so nothing of them is in /app while the agent works.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from plugins.bench_suites import gitrepo
from plugins.bench_suites.suite import BuiltinSuite
from plugins.bench_suites.swe_suite import Change, SpecError

DATA = Path(__file__).parent
TASKS = DATA / "terminal"
REPOS = DATA / "terminal_repos"
REQUIRED = ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh")
_PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*|SHA256:[^@\s]+)@")


def task_dirs(root: Path = TASKS) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def check_task(task: Path) -> None:
    missing = [rel for rel in REQUIRED if not (task / rel).is_file()]
    if missing:
        raise SpecError(f"{task}: a Harbor task folder needs {', '.join(missing)}")
    try:
        config = tomllib.loads((task / "task.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{task / 'task.toml'}: {e}") from None
    if config.get("schema_version") != "1.4":
        raise SpecError(f'{task / "task.toml"}: schema_version must be "1.4"')
    for section in ("verifier", "agent"):
        timeout = config.get(section, {}).get("timeout_sec")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise SpecError(f"{task / 'task.toml'}: [{section}] timeout_sec must be a positive number")


def copy_task(src: Path, dst: Path) -> None:
    """Copy a task folder with modes that do not depend on the checkout or the umask."""
    for path in sorted(src.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        target.chmod(0o755 if path.suffix == ".sh" else 0o644)


def build_repo(spec_path: Path, app: Path) -> dict[str, str]:
    """Build the repository that spec_path describes under app (environment/); returns the placeholders it defines."""
    try:
        spec = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{spec_path}: {e}") from None
    commits = spec.get("commits")
    rel = spec.get("path")
    if not isinstance(rel, str) or not rel or ".." in Path(rel).parts or not isinstance(commits, list) or not commits:
        raise SpecError(f"{spec_path}: needs `path` (inside /app) and a non-empty [[commits]] list")
    repo = app / rel
    gitrepo.init(repo)
    files: gitrepo.Files = {}
    shas, values = [], {}
    for i, c in enumerate(commits, 1):
        where = f"{spec_path} commit {i}"
        if not isinstance(c.get("message"), str) or not isinstance(c.get("date"), str):
            raise SpecError(f"{where}: needs `message` and `date`")
        new = Change(files=c.get("files", {}), edits=c.get("edits", [])).apply(files, where)
        gitrepo.write_files(repo, {k: v for k, v in new.items() if files.get(k) != v})
        files = new
        shas.append(gitrepo.commit(repo, c["message"], c["date"]))
        if "mark" in c:
            values[str(c["mark"])] = shas[-1]
    for tag, number in spec.get("tags", {}).items():
        if not isinstance(number, int) or not 1 <= number <= len(shas):
            raise SpecError(f"{spec_path}: tag {tag!r} names commit {number!r}; commits are numbered 1..{len(shas)}")
        gitrepo.git(repo, "tag", tag, shas[number - 1])
    gitrepo.git(repo, "reflog", "expire", "--expire=all", "--all")  # no record of how it was built
    values["HEAD"] = shas[-1]
    return values


def fill_placeholders(task: Path, values: dict[str, str]) -> None:
    app = task / "environment"
    for path in sorted((task / "tests").rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")

        def value(m: re.Match, path: Path = path) -> str:
            key = m.group(1)
            if key.startswith("SHA256:"):
                target = app / key.removeprefix("SHA256:")
                if not target.is_file():
                    raise SpecError(f"{path}: @{key}@ names no file of environment/")
                return hashlib.sha256(target.read_bytes()).hexdigest()
            if key not in values:
                raise SpecError(f"{path}: nothing defines the placeholder @{key}@")
            return values[key]

        new = _PLACEHOLDER.sub(value, text)
        if new != text:
            path.write_text(new, encoding="utf-8")


class TerminalSuite(BuiltinSuite):
    kind = "terminal"
    name = "builtin"
    description = (
        "Offline Harbor-format terminal tasks (files, text processing, csv/json wrangling, log analysis, git, "
        "a small build, and interactive ones: an installer's prompts, pdb, git rebase -i) that need only coreutils, "
        "git and Python (and vi for the rebase)"
    )

    def build(self, tmp: Path, dest: Path) -> list[str]:
        names = []
        for src in task_dirs(TASKS):
            check_task(src)
            dst = tmp / src.name
            copy_task(src, dst)
            values: dict[str, str] = {}
            spec = REPOS / f"{src.name}.toml"
            if spec.is_file():
                values = build_repo(spec, dst / "environment")
            fill_placeholders(dst, values)
            names.append(src.name)
        return names
