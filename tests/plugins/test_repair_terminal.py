"""The repair family as Harbor task folders: the SWE rows' instances, deterministic, splits disjoint; the oracle
solves each and nop none; the verifier grades /tests' copies, not what the agent can edit; the expert solves one
through `glm5 bench terminal`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.bench.tasks import load_terminal_tasks
from agent.sandbox import probe
from plugins.bench_suites import gitrepo
from plugins.bench_suites.repair_family import KINDS, generate, name_split
from plugins.bench_suites.repair_suite import RepairSuite, graded_files
from plugins.bench_suites.repair_terminal import RepairTerminalSuite

needs_bwrap = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")


def files(task: Path) -> dict[str, bytes]:
    return {
        p.relative_to(task).as_posix(): p.read_bytes()
        for p in sorted(task.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(task).parts
    }


def test_a_task_is_the_swe_rows_instance_the_same_way_twice(tmp_path):
    suite = RepairTerminalSuite("heldout", seed=3, count=2)
    assert suite.key == "terminal:repair-heldout-s3-n2" and RepairTerminalSuite("train").key == "terminal:repair-train"
    a = suite.materialize(tmp_path / "a")
    b = RepairTerminalSuite("heldout", seed=3, count=2).materialize(tmp_path / "b")
    (jsonl,) = RepairSuite("heldout", seed=3, count=2).materialize(tmp_path / "swe")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    tasks = load_terminal_tasks(a)
    assert [t.task_id for t in tasks] == [r["instance_id"] for r in rows] == [p.name for p in a]
    for i, (ta, tb, task, row) in enumerate(zip(a, b, tasks, rows, strict=True)):
        assert files(ta) == files(tb)
        inst = generate(3, "heldout", i)
        head = gitrepo.git(ta / "environment", "rev-parse", "HEAD").strip()
        assert head == gitrepo.git(tb / "environment", "rev-parse", "HEAD").strip() == row["base_commit"]
        assert gitrepo.git(ta / "environment", "status", "--porcelain").strip() == "?? Dockerfile"
        assert row["problem_statement"] in task.instruction and f"`{inst.package}`" in task.instruction
        assert (ta / "solution" / "fix.diff").read_text() == row["patch"]
        cases = {f"tests/{p.name}": p.read_text() for p in (ta / "tests" / "cases").iterdir()}
        assert cases == {k: v for k, v in graded_files(inst).items() if k.startswith("tests/")}
        assert "_more" in "".join(cases.values())
        assert "_more" not in "".join(p.read_text() for p in (ta / "environment" / "tests").iterdir())
        meta = task.config["metadata"]
        assert (meta["seed"], meta["split"], meta["index"], meta["bug_kind"]) == (3, "heldout", i, row["bug_kind"])
        assert not re.search(r"@[A-Z_]+@", (ta / "task.toml").read_text() + task.instruction)


def test_the_splits_share_no_function_name(tmp_path):
    def names(split: str) -> set[str]:
        out = set()
        for task in RepairTerminalSuite(split, seed=1, count=8).materialize(tmp_path / split):
            for py in (task / "environment").rglob("*.py"):
                out |= set(re.findall(r"^def (\w+)\(", py.read_text(), re.M))
        return {n for n in out if not n.startswith("test_")}

    train, held = names("train"), names("heldout")
    assert len(train) > 20 and len(held) > 20 and train.isdisjoint(held)
    assert {name_split(n) for n in held} == {"heldout"} and {name_split(n) for n in train} == {"train"}


@needs_bwrap
@pytest.mark.slow
def test_the_oracle_solves_each_and_nop_none_graded_by_the_swe_rows_tests(tmp_path):
    from agent.bench.validate import validate

    paths = RepairTerminalSuite("train", seed=5, count=4).materialize(tmp_path / "train")
    paths += RepairTerminalSuite("heldout", seed=5, count=2).materialize(tmp_path / "heldout")
    tasks = load_terminal_tasks(paths)
    assert sorted(t.config["metadata"]["bug_kind"] for t in tasks[:4]) == sorted(KINDS)  # every kind once
    assert validate(tasks, tmp_path / "work") == {t.task_id: [] for t in tasks}
    # nop's checks are the SWE row's: FAIL_TO_PASS fail, PASS_TO_PASS pass, under the same node ids
    for task in tasks:
        split, index = task.config["metadata"]["split"], task.config["metadata"]["index"]
        inst = generate(5, split, index)
        tests = json.loads((tmp_path / "work" / "trials" / task.task_id / "nop" / "report.json").read_text())["tests"]
        assert tests == {**dict.fromkeys(inst.fail_to_pass, "FAILED"), **dict.fromkeys(inst.pass_to_pass, "PASSED")}


@needs_bwrap
@pytest.mark.slow
def test_the_verifier_grades_its_own_copies_of_the_tests(tmp_path):
    from agent.bench.agents import CmdAgent
    from agent.bench.trial import TrialConfig, run_trial

    (path,) = RepairTerminalSuite("train", seed=0, count=1).materialize(tmp_path / "suite")
    (task,) = load_terminal_tasks([path])
    inst = generate(0, "train", 0)
    config = TrialConfig(cache_dir=tmp_path / "cache", flaky_reruns=0)
    cheats = {
        # the visible tests emptied: the hidden copies still fail
        "tests": "for f in tests/test_*.py; do echo 'def test_ok(): pass' > $f; done",
        # a package that exits 0 on import must not end the verifier with 0
        "exit": f"echo 'raise SystemExit(0)' >> {inst.package}/__init__.py",
    }
    for name, command in cheats.items():
        r = run_trial(task, CmdAgent(command), tmp_path / "trials" / name, config)
        assert (r.status, r.reward) == ("unresolved", 0.0), (name, r.reason)
        assert set(r.tests) == set(inst.fail_to_pass + inst.pass_to_pass)


@needs_bwrap
@pytest.mark.slow
def test_the_expert_resolves_a_task_through_glm5_bench_terminal(tmp_path):
    from finetune.proof.expert_server import MODEL, ExpertServer

    (path,) = RepairTerminalSuite("heldout", seed=0, count=1).materialize(tmp_path / "suite")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_")}
    env["GLM5_CONFIG_DIR"] = str(tmp_path / "config")  # not the user's config
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    with ExpertServer() as server:
        p = subprocess.run([sys.executable, "-m", "glm5cli", "bench", "terminal", str(path), "--out", str(tmp_path / "run"),
                            "--agent", "glm5", "--base-url", server.base_url, "--model", MODEL, "--max-turns", "8",
                            "--agent-profile", "compact", "--json"], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert server.app.state.requests == 4  # read, edit, bash, answer
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["summary"]["resolved"] == 1
