"""The built-in bench suites: registered, deterministic, and valid tasks.

For every SWE instance, in a fresh clone at base_commit with test_patch applied, each FAIL_TO_PASS test fails and
each PASS_TO_PASS test passes; with the gold patch applied too, all pass. For every terminal task, in a bubblewrap
sandbox with /app, /logs and /tests mapped as the bench maps them, solution/solve.sh then tests/test.sh gives
reward 1 and tests/test.sh alone gives 0. One pytest run per instance and state, to stay fast.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.bench.tasks import load_swe_tasks, load_terminal_tasks
from agent.plugin_registry import PluginContext, PluginManager
from plugins.bench_suites import gitrepo
from plugins.bench_suites.suite import MARKER
from plugins.bench_suites.swe_suite import JSONL, SpecError, SWESuite, load_instance, load_specs
from plugins.bench_suites.terminal_suite import TerminalSuite, task_dirs

INSTANCE_IDS = [f"glm5-builtin__{i.instance_id}" for i in load_specs()[1]]
TASK_NAMES = [p.name for p in task_dirs()]
# The kinds of bug the suite promises (issue 16) and the brief's extra ones.
KINDS = {
    "off-by-one",
    "wrong operator",
    "missing case",
    "state not reset",
    "API misuse",
    "multi-file",
    "wrong default",
    "exception handling",
    "string formatting",
    "boundary on empty input",
}


@pytest.fixture(scope="module")
def swe(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    dest = tmp_path_factory.mktemp("swe")
    [jsonl] = SWESuite().materialize(dest)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return dest, {r["instance_id"]: r for r in rows}


@pytest.fixture(scope="module")
def terminal(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    dest = tmp_path_factory.mktemp("terminal")
    return dest, {p.name: p for p in TerminalSuite().materialize(dest)}


def test_both_suites_are_registered_as_plugins():
    suites = PluginManager(entry_points=False).benchmarks(PluginContext())
    assert suites["swe:builtin"].kind == "swe" and suites["terminal:builtin"].kind == "terminal"
    assert suites["swe:repair-heldout"].kind == "swe" and suites["terminal:repair-heldout"].kind == "terminal"
    for suite in suites.values():
        assert (
            suite.name in ("builtin", "repair-train", "repair-heldout", "multilingual")
            and suite.description
            and suite.deterministic is True
        )
        assert callable(suite.materialize)


def test_swe_instances_are_swe_bench_rows(swe):
    dest, rows = swe
    assert len(rows) >= 12 and sorted(rows) == sorted(INSTANCE_IDS)
    assert [t.instance_id for t in load_swe_tasks(dest / JSONL)] == list(rows)  # the bench's loader reads them
    assert {r["bug_kind"] for r in rows.values()} >= KINDS
    for iid, r in rows.items():
        assert re.fullmatch(r"glm5-builtin__[a-z]+-\d+", iid)
        repo = Path(r["repo"])
        assert repo.is_absolute() and repo.parent == dest / "repos" and (repo / ".git").is_dir()
        for key in ("base_commit", "environment_setup_commit"):
            assert re.fullmatch(r"[0-9a-f]{40}", r[key])
            assert gitrepo.git(repo, "cat-file", "-t", r[key]).strip() == "commit"
        assert r["version"] and r["created_at"].endswith("Z")
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            tests = json.loads(r[key])  # JSON strings, as the SWE-bench datasets store them
            assert isinstance(r[key], str) and all(
                re.fullmatch(r"tests/test_\w+\.py::\w+(\[[^\]]+\])?", t) for t in tests
            )
        assert json.loads(r["FAIL_TO_PASS"])
        files = sorted({t.split("::")[0] for t in json.loads(r["FAIL_TO_PASS"])})
        assert r["log_parser"] == "pytest" and r["test_cmd"].split("cacheprovider ")[1].split() >= files
        for patch in (r["patch"], r["test_patch"]):
            assert patch.startswith("diff --git a/")
        # the gold patch touches no test; the test patch touches nothing but tests
        assert not re.search(r"^\+\+\+ b/tests/", r["patch"], re.M)
        assert all(p.startswith("tests/") for p in re.findall(r"^\+\+\+ b/(\S+)", r["test_patch"], re.M))


def test_repositories_hold_neither_the_fix_nor_the_tests(swe):
    """An agent may read every object of the repository it works in: the post-images must not be among them."""
    _, rows = swe
    for r in rows.values():
        objects = gitrepo.git(Path(r["repo"]), "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
        added = re.findall(r"^index [0-9a-f]{40}\.\.([0-9a-f]{40})", r["patch"] + r["test_patch"], re.M)
        assert added and not set(added) & set(objects.split()), r["instance_id"]


def test_problem_statements_do_not_give_the_fix_away(swe):
    _, rows = swe
    for r in rows.values():
        added = [ln[1:].strip() for ln in r["patch"].splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        leaked = [ln for ln in added if len(ln) > 12 and ln in r["problem_statement"]]
        assert not leaked, (r["instance_id"], leaked)


def test_swe_materialize_is_deterministic(swe, tmp_path):
    dest, rows = swe
    [again] = SWESuite().materialize(tmp_path)
    other = {}
    for line in again.read_text().splitlines():
        r = json.loads(line)
        assert r.pop("repo") == str(tmp_path / "repos" / Path(rows[r["instance_id"]]["repo"]).name)
        other[r["instance_id"]] = r
    assert other == {k: {f: v for f, v in r.items() if f != "repo"} for k, r in rows.items()}
    for name in os.listdir(dest / "repos"):
        a, b = dest / "repos" / name, tmp_path / "repos" / name
        assert gitrepo.git(a, "rev-parse", "main") == gitrepo.git(b, "rev-parse", "main")
        assert gitrepo.git(a, "log", "--format=%H %an %ad %s", "main") == gitrepo.git(
            b, "log", "--format=%H %an %ad %s", "main"
        )


def test_materialize_reuses_refuses_and_recovers(swe, tmp_path):
    dest, _ = swe
    marker = (dest / MARKER).read_text()
    jsonl = dest / JSONL
    mtime = jsonl.stat().st_mtime_ns
    assert SWESuite().materialize(dest) == [jsonl] and jsonl.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert (dest / MARKER).read_text() == marker

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="did not write"):
        SWESuite().materialize(foreign)
    assert (foreign / "notes.txt").read_text() == "mine"

    # a build killed half way leaves its temporary folder and no marker: the next call starts over
    killed = tmp_path / "killed"
    (killed / ".glm5-build-x1" / "repos").mkdir(parents=True)
    assert TerminalSuite().materialize(killed)
    assert not list(killed.glob(".glm5-build-*")) and (killed / MARKER).is_file()


def test_concurrent_materializations_build_once(tmp_path):
    """Two bench processes starting at once on one folder: the lock lets one build and the other reuse it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: TerminalSuite().materialize(tmp_path), range(2))
    assert a == b and sorted(p.name for p in a) == TASK_NAMES
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*TASK_NAMES, MARKER, ".glm5-suite.lock"])


def _pytest_statuses(work: Path, files: list[str]) -> dict[str, str]:
    """Per-test statuses from pytest's -rA summary, as the SWE-bench log parser reads them."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTHONPATH", None)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", *files],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    statuses = {}
    for line in p.stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", line)
        if m:
            statuses[m.group(2)] = m.group(1)
    assert statuses, f"pytest ran no test (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return statuses


def _apply(work: Path, patch: str) -> None:
    subprocess.run(["git", "-C", str(work), "apply", "-"], input=patch, text=True, check=True, env=gitrepo.git_env())


@pytest.mark.parametrize("instance_id", INSTANCE_IDS)
def test_swe_instance_fails_before_and_passes_after_the_gold_patch(swe, tmp_path, instance_id):
    r = swe[1][instance_id]
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "--quiet", r["repo"], str(work)], check=True, env=gitrepo.git_env())
    gitrepo.git(work, "checkout", "--quiet", "--detach", r["base_commit"])
    _apply(work, r["test_patch"])
    files = sorted(set(re.findall(r"^\+\+\+ b/(\S+)", r["test_patch"], re.M)))
    f2p, p2p = json.loads(r["FAIL_TO_PASS"]), json.loads(r["PASS_TO_PASS"])

    before = _pytest_statuses(work, files)
    assert {t: before.get(t) for t in f2p} == dict.fromkeys(f2p, "FAILED"), "FAIL_TO_PASS must fail before the fix"
    assert {t: before.get(t) for t in p2p} == dict.fromkeys(p2p, "PASSED"), "PASS_TO_PASS must pass before the fix"

    _apply(work, r["patch"])
    after = _pytest_statuses(work, files)
    assert after == dict.fromkeys(f2p + p2p, "PASSED"), (
        "with the gold patch every listed test passes, and no other runs"
    )


def test_terminal_tasks_are_harbor_folders(terminal):
    import tomllib

    dest, tasks = terminal
    assert len(tasks) >= 6 and sorted(tasks) == TASK_NAMES
    for name, task in tasks.items():
        config = tomllib.loads((task / "task.toml").read_text())
        assert config["schema_version"] == "1.4" and config["task"]["name"] == f"glm5-builtin/{name}"
        assert config["verifier"]["timeout_sec"] > 0 and config["agent"]["timeout_sec"] > 0
        assert config["environment"]["allow_internet"] is False
        for script in ("tests/test.sh", "solution/solve.sh"):
            assert os.access(task / script, os.X_OK), f"{name}/{script} is not executable"
        assert (task / "instruction.md").read_text().strip()
        assert "/logs/verifier/reward.txt" in (task / "tests" / "test.sh").read_text()
        for path in (task / "tests").rglob("*"):
            assert not re.search(r"@[A-Z][A-Z0-9_]*@|@SHA256:", path.read_text()), f"{path}: a placeholder left"
    loaded = load_terminal_tasks([dest])  # the bench's own loader reads the folders as they are
    assert sorted(t.path.name for t in loaded) == TASK_NAMES


def test_terminal_materialize_is_deterministic(terminal, tmp_path):
    dest, tasks = terminal
    again = {p.name: p for p in TerminalSuite().materialize(tmp_path)}

    def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
        out = {}
        for p in sorted(root.rglob("*")):
            if p.is_file() and "/.git/" not in p.as_posix():
                out[p.relative_to(root).as_posix()] = (p.stat().st_mode, p.read_bytes())
        return out

    for name, task in tasks.items():
        assert snapshot(task) == snapshot(again[name]), name
    repo = "git-find-regression/environment/repo"
    assert gitrepo.git(dest / repo, "rev-parse", "main", "v1.0") == gitrepo.git(
        tmp_path / repo, "rev-parse", "main", "v1.0"
    )


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    p = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "true"], capture_output=True)
    return p.returncode == 0


def _sandboxed(
    root: Path, script: str, mounts: dict[str, Path], path: str | None = None
) -> subprocess.CompletedProcess:
    """Run `bash script` with the host's / read-only and `mounts` (path inside -> host folder) writable."""
    argv = ["bwrap", "--die-with-parent", "--unshare-net", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for entry in sorted(os.listdir("/")):
        if entry in ("proc", "dev", "tmp", "sys") or f"/{entry}" in mounts:
            continue
        top = Path("/") / entry
        if top.is_symlink():
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    for inside, host in mounts.items():
        argv += ["--bind", str(host), inside]
    argv += ["--chdir", "/app", "--setenv", "HOME", "/tmp"]
    if path is not None:
        argv += ["--setenv", "PATH", path]
    argv += [shutil.which("bash"), script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not _bwrap_works(), reason="needs a working bubblewrap (bwrap)")
@pytest.mark.parametrize("name", TASK_NAMES)
def test_terminal_task_oracle_scores_1_and_nop_scores_0(terminal, tmp_path, name):
    task = terminal[1][name]
    rewards, statuses = {}, {}
    for agent in ("oracle", "nop"):
        trial = tmp_path / agent
        shutil.copytree(task / "environment", trial / "app", symlinks=True, ignore=shutil.ignore_patterns("Dockerfile"))
        (trial / "logs").mkdir()
        if agent == "oracle":
            shutil.copytree(task / "solution", trial / "solution")
            p = _sandboxed(
                trial,
                "/solution/solve.sh",
                {"/app": trial / "app", "/logs": trial / "logs", "/solution": trial / "solution"},
            )
            assert p.returncode == 0, p.stderr[-2000:]
        # the tests arrive only now, after the agent has finished
        shutil.copytree(task / "tests", trial / "tests")
        p = _sandboxed(
            trial, "/tests/test.sh", {"/app": trial / "app", "/logs": trial / "logs", "/tests": trial / "tests"}
        )
        reward = trial / "logs" / "verifier" / "reward.txt"
        assert reward.is_file(), p.stdout[-2000:] + p.stderr[-2000:]
        rewards[agent] = reward.read_text().strip()
        checks = json.loads((trial / "logs" / "verifier" / "ctrf.json").read_text())["results"]["tests"]
        statuses[agent] = {c["status"] for c in checks}
    assert rewards == {"oracle": "1", "nop": "0"}
    assert statuses["oracle"] == {"passed"} and "failed" in statuses["nop"]


@pytest.mark.skipif(not _bwrap_works(), reason="needs a working bubblewrap (bwrap)")
def test_a_verifier_that_cannot_run_writes_no_reward(terminal, tmp_path):
    """No python3 in the environment is an infrastructure failure: no reward at all, never a 0 that looks scored."""
    task = terminal[1]["word-frequency"]
    shutil.copytree(task / "environment", tmp_path / "app", ignore=shutil.ignore_patterns("Dockerfile"))
    shutil.copytree(task / "tests", tmp_path / "tests")
    (tmp_path / "logs").mkdir()
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "mkdir").symlink_to(shutil.which("mkdir"))
    mounts = {"/app": tmp_path / "app", "/logs": tmp_path / "logs", "/tests": tmp_path / "tests", "/bare": bare}
    p = _sandboxed(tmp_path, "/tests/test.sh", mounts, path="/bare")
    assert p.returncode == 127 and not (tmp_path / "logs" / "verifier" / "reward.txt").exists(), p.stderr


def test_a_bad_instance_file_is_named(tmp_path):
    bad = tmp_path / "textkit-9.toml"
    bad.write_text('kind = "x"\ncreated_at = "2025-01-01T00:00:00Z"\nproblem_statement = "p"\nFAIL_TO_PASS = ["t"]\n')
    with pytest.raises(SpecError, match=r"textkit-9\.toml: `FAIL_TO_PASS` must be a list of pytest node ids"):
        load_instance(bad)
    bad.write_text("kind = [unclosed\n")
    with pytest.raises(SpecError, match=r"textkit-9\.toml"):
        load_instance(bad)


def test_an_edit_that_does_not_apply_is_named(tmp_path):
    from plugins.bench_suites.swe_suite import Change

    change = Change(edits=[{"path": "a.py", "old": "missing", "new": "x"}])
    with pytest.raises(SpecError, match=r"here: edits\[0\] `old` occurs 0 times in a.py"):
        change.apply({"a.py": "print(1)\n"}, "here")
