"""The built-in SWE-bench-format suite: small Python repositories generated as real git repositories.

Data (plugins/bench_suites/swe/):
    repos/<name>.toml              a repository's first commit: name, owner, version, date, message, [files]
    instances/<name>-<n>.toml      one task of that repository, in order of n: the commit that is its base (optional
                                   [base] with files/edits, committed on main), the issue text, the gold fix
                                   ([patch]) and the tests that expose the bug ([test_patch]), FAIL_TO_PASS and
                                   PASS_TO_PASS as pytest node ids
An edit is {path, old, new} (old occurs exactly once in the file) or {path, append}; `files` gives whole files.

`materialize(dest)` writes dest/repos/<name>/ (main holds the history; each instance's base_commit is a commit of
it; environment_setup_commit is the first commit, where the packaging is set up) and dest/swe-builtin.jsonl, one
SWE-bench instance a line with `repo` the absolute path of the repository and the test lists as JSON strings, as
the SWE-bench datasets store them, plus glm5's optional `test_cmd` (pytest over the test patch's files, plugin
autoload off) and `log_parser` ("pytest"). The gold patch and test patch are diffs made outside the repository, so its
objects hold neither. Every test needs only Python and pytest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from plugins.bench_suites import gitrepo
from plugins.bench_suites.suite import BuiltinSuite

DATA = Path(__file__).parent / "swe"
JSONL = "swe-builtin.jsonl"


class SpecError(ValueError):
    """A suite data file is malformed; the message names the file and the field."""


@dataclass
class Change:
    """Files and edits applied on top of a file set (a commit, a gold patch, a test patch)."""

    files: dict[str, str] = field(default_factory=dict)
    edits: list[dict] = field(default_factory=list)
    message: str = ""

    def apply(self, files: gitrepo.Files, where: str) -> gitrepo.Files:
        out = {**files, **self.files}
        for i, e in enumerate(self.edits):
            path = e.get("path")
            if path not in out:
                raise SpecError(f"{where}: edits[{i}] names {path!r}, which is not a file of the repository")
            if "append" in e:
                out[path] = out[path] + e["append"]
                continue
            old, new = e.get("old"), e.get("new")
            if not isinstance(old, str) or not isinstance(new, str) or not old:
                raise SpecError(f"{where}: edits[{i}] needs `old` and `new` strings (or `append`)")
            if out[path].count(old) != 1:
                raise SpecError(f"{where}: edits[{i}] `old` occurs {out[path].count(old)} times in {path}, not once")
            out[path] = out[path].replace(old, new)
        return out


@dataclass
class RepoSpec:
    name: str
    owner: str
    version: str
    date: str
    message: str
    files: dict[str, str]


@dataclass
class InstanceSpec:
    repo: str
    number: int
    created_at: str
    kind: str
    problem_statement: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    patch: Change
    test_patch: Change
    base: Change | None = None
    hints_text: str = ""
    difficulty: str = "<15 min fix"
    source: str = ""

    @property
    def instance_id(self) -> str:
        return f"{self.repo}-{self.number}"


def _load_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{path}: {e}") from None


def _req(data: dict, key: str, kind: type, where: Path):
    value = data.get(key)
    if not isinstance(value, kind) or (kind in (str, list, dict) and not value):
        raise SpecError(f"{where}: `{key}` must be a non-empty {kind.__name__}")
    return value


def _change(data: dict | None, key: str, where: Path) -> Change | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise SpecError(f"{where}: [{key}] must be a table")
    files, edits = data.get("files", {}), data.get("edits", [])
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise SpecError(f"{where}: {key}.files must map paths to file text")
    if not isinstance(edits, list) or not all(isinstance(e, dict) for e in edits):
        raise SpecError(f"{where}: {key}.edits must be a list of tables")
    return Change(files=files, edits=edits, message=str(data.get("message", "")))


def load_repo(path: Path) -> RepoSpec:
    d = _load_toml(path)
    files = _req(d, "files", dict, path)
    return RepoSpec(
        name=path.stem,
        owner=_req(d, "owner", str, path),
        version=_req(d, "version", str, path),
        date=_req(d, "date", str, path),
        message=_req(d, "message", str, path),
        files=files,
    )


def load_instance(path: Path) -> InstanceSpec:
    d = _load_toml(path)
    repo, _, number = path.stem.rpartition("-")
    if not repo or not number.isdigit():
        raise SpecError(f"{path}: an instance file is named <repo>-<number>.toml")
    lists = {}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = d.get(key)
        if not isinstance(value, list) or not all(isinstance(t, str) and "::" in t for t in value):
            raise SpecError(f"{path}: `{key}` must be a list of pytest node ids (path::name)")
        lists[key] = value
    if not lists["FAIL_TO_PASS"]:
        raise SpecError(f"{path}: `FAIL_TO_PASS` is empty: the tests must expose the bug")
    patch = _change(_req(d, "patch", dict, path), "patch", path)
    test_patch = _change(_req(d, "test_patch", dict, path), "test_patch", path)
    return InstanceSpec(
        repo=repo,
        number=int(number),
        created_at=_req(d, "created_at", str, path),
        kind=_req(d, "kind", str, path),
        problem_statement=_req(d, "problem_statement", str, path),
        fail_to_pass=lists["FAIL_TO_PASS"],
        pass_to_pass=lists["PASS_TO_PASS"],
        patch=patch,
        test_patch=test_patch,
        base=_change(d.get("base"), "base", path),
        hints_text=str(d.get("hints_text", "")),
        difficulty=str(d.get("difficulty", "<15 min fix")),
        source=str(path),
    )


def load_specs(data: Path = DATA) -> tuple[dict[str, RepoSpec], list[InstanceSpec]]:
    repos = {p.stem: load_repo(p) for p in sorted((data / "repos").glob("*.toml"))}
    instances = [load_instance(p) for p in (data / "instances").glob("*.toml")]
    for inst in instances:
        if inst.repo not in repos:
            raise SpecError(f"{inst.source}: no repository {inst.repo!r} in {data / 'repos'}")
    instances.sort(key=lambda i: (i.repo, i.number))
    return repos, instances


def _day_before(stamp: str) -> str:
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00")) - timedelta(days=1)
    return when.isoformat()


def pytest_command(tested: gitrepo.Files, base: gitrepo.Files) -> str:
    """pytest over the test files the test patch touches. The repositories need no pytest plugin, and one that
    happens to be installed where the bench runs (randomly, xdist, asyncio...) could change the results or the
    time: autoload is off."""
    files = sorted(k for k, v in tested.items() if base.get(k) != v and k.endswith(".py"))
    return "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider " + " ".join(files)


def build_repo(spec: RepoSpec, instances: list[InstanceSpec], path: Path, final: Path) -> list[dict]:
    """Create the repository of `spec` at path (it will live at `final`); return its instances as SWE-bench rows."""
    gitrepo.init(path)
    gitrepo.write_files(path, spec.files)
    setup_commit = gitrepo.commit(path, spec.message, spec.date)
    files = dict(spec.files)
    head = setup_commit
    rows = []
    for inst in instances:
        where = inst.source
        if inst.base is not None:
            new = inst.base.apply(files, f"{where} [base]")
            for rel in set(files) - set(new):
                (path / rel).unlink()
            gitrepo.write_files(path, {k: v for k, v in new.items() if files.get(k) != v})
            files = new
            head = gitrepo.commit(
                path, inst.base.message or f"Update for {inst.instance_id}", _day_before(inst.created_at)
            )
        fixed = inst.patch.apply(files, f"{where} [patch]")
        tested = inst.test_patch.apply(files, f"{where} [test_patch]")
        if any(k.startswith("tests/") or "/tests/" in k for k, v in fixed.items() if files.get(k) != v):
            raise SpecError(f"{where}: the gold patch changes test files; those belong in [test_patch]")
        rows.append(
            {
                "repo": str(final),
                "instance_id": f"{spec.owner}__{inst.instance_id}",
                "base_commit": head,
                "patch": gitrepo.diff(files, fixed),
                "test_patch": gitrepo.diff(files, tested),
                "problem_statement": inst.problem_statement,
                "hints_text": inst.hints_text,
                "created_at": inst.created_at,
                "version": spec.version,
                "FAIL_TO_PASS": json.dumps(inst.fail_to_pass),
                "PASS_TO_PASS": json.dumps(inst.pass_to_pass),
                "environment_setup_commit": setup_commit,
                "difficulty": inst.difficulty,
                "bug_kind": inst.kind,
                "test_cmd": pytest_command(tested, files),
                "log_parser": "pytest",
            }
        )
    return rows


class SWESuite(BuiltinSuite):
    kind = "swe"
    name = "builtin"
    description = (
        "Offline SWE-bench-format tasks over small generated Python repositories (pytest only): off-by-one, "
        "wrong operator, missing case, state not reset, API misuse, multi-file and more"
    )

    def build(self, tmp: Path, dest: Path) -> list[str]:
        repos, instances = load_specs(DATA)
        rows = []
        for name, spec in repos.items():
            mine = [i for i in instances if i.repo == name]
            rows += build_repo(spec, mine, tmp / "repos" / name, dest / "repos" / name)
        with open(tmp / JSONL, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return ["repos", JSONL]

    def outputs(self, dest: Path, names: list[str]) -> list[Path]:
        return [dest / JSONL]
