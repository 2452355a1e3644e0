"""The generated repair family: deterministic, splits disjoint, one planted bug on a unique line, valid tasks."""

from __future__ import annotations

import difflib
import json

import pytest

from plugins.bench_suites.repair_family import KINDS, generate, name_pool, name_split
from plugins.bench_suites.repair_suite import RepairSuite


def test_an_instance_is_a_pure_function_of_seed_split_and_index():
    a, b = generate(7, "train", 3), generate(7, "train", 3)
    assert a.files(fixed=False) == b.files(fixed=False) and a.problem_statement == b.problem_statement
    assert a.hidden_test == b.hidden_test and a.fail_to_pass == b.fail_to_pass
    assert generate(8, "train", 3).files(fixed=False) != a.files(fixed=False)
    assert generate(7, "train", 4).files(fixed=False) != a.files(fixed=False)


def test_splits_share_no_instance_and_no_function_name():
    assert set(name_pool("train")).isdisjoint(name_pool("heldout")) and len(name_pool("heldout")) > 100
    train = [generate(0, "train", i) for i in range(60)]
    held = [generate(0, "heldout", i) for i in range(30)]

    def names(insts):
        return {f.name for i in insts for fns in i.modules.values() for f in fns}

    assert names(train).isdisjoint(names(held))
    assert all(name_split(n) == "heldout" for n in names(held))
    assert {i.instance_id for i in train}.isdisjoint(i.instance_id for i in held)
    # varied: many packages, modules and function names; every kind in both splits
    assert len({i.package for i in train}) > 5 and len(names(train)) > 150
    assert {i.bug.kind for i in train} == {i.bug.kind for i in held} == set(KINDS)


def test_the_dev_split_draws_held_out_names_but_shares_no_instance_with_the_held_out_split():
    dev = [generate(0, "dev", i) for i in range(25)]
    held = [generate(0, "heldout", i) for i in range(25)]
    train_names = set(name_pool("train"))
    for d in dev:
        names = {f.name for fns in d.modules.values() for f in fns}
        assert all(name_split(n) == "heldout" for n in names) and names.isdisjoint(train_names)
        assert d.instance_id.startswith("glm5proof__repair-dev-")
    # another random stream: no dev instance is a held-out one under another name
    assert {d.problem_statement for d in dev}.isdisjoint(h.problem_statement for h in held)
    assert all(d.files(fixed=False) != h.files(fixed=False) for d, h in zip(dev, held, strict=True))
    assert {d.bug.kind for d in dev} == set(KINDS)


@pytest.mark.parametrize("split", ["train", "heldout", "dev"])
def test_the_fix_is_one_line_and_the_issue_names_where(split):
    for i in range(24):
        inst = generate(1, split, i)
        before, after = inst.files(fixed=False), inst.files(fixed=True)
        changed = [k for k in before if before[k] != after[k]]
        assert changed == [inst.path]
        delta = [
            line
            for line in difflib.unified_diff(before[inst.path].splitlines(), after[inst.path].splitlines(), n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ]
        assert len(delta) == 2, delta  # one line out, one line in
        # the issue quotes the line as it is and as it should be; the edit tool can target it as quoted
        assert inst.bug.old == inst.bug.bad_line.strip() and inst.bug.new == inst.bug.lines[inst.bug.line_no].strip()
        assert before[inst.path].count(inst.bug.old) == 1
        assert before[inst.path].replace(inst.bug.old, inst.bug.new) == after[inst.path]
        text = inst.problem_statement
        visible = f"tests/test_{inst.buggy[0]}.py::test_{inst.bug.name}"
        assert inst.path in text and f"`{inst.bug.name}`" in text and visible in text
        assert f"`{inst.bug.old}`" in text and f"`{inst.bug.new}`" in text
        assert inst.fail_to_pass == [visible, visible + "_more"]
        assert visible not in inst.pass_to_pass and len(inst.pass_to_pass) >= 3
        # the hidden case is not in the repository
        assert "_more" not in "".join(before.values())


def test_materialize_writes_swe_bench_rows_the_same_way_twice(tmp_path):
    suite = RepairSuite("heldout", seed=3, count=2)
    assert suite.name == "repair-heldout-s3-n2" and RepairSuite("heldout").name == "repair-heldout"
    (a,) = suite.materialize(tmp_path / "a")
    (b,) = RepairSuite("heldout", seed=3, count=2).materialize(tmp_path / "b")
    rows_a = [json.loads(line) for line in a.read_text().splitlines()]
    rows_b = [json.loads(line) for line in b.read_text().splitlines()]
    assert len(rows_a) == 2
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert ra["base_commit"] == rb["base_commit"] and ra["patch"] == rb["patch"]
        assert ra["repo"] == str(tmp_path / "a" / "repos" / ra["instance_id"])
        assert json.loads(ra["FAIL_TO_PASS"])[1].endswith("_more") and ra["bug_kind"] in KINDS
        assert "_more" in ra["test_patch"] and "_more" not in ra["patch"]
    with pytest.raises(ValueError, match="split 'test'"):
        RepairSuite("test")


@pytest.mark.slow
def test_the_oracle_solves_every_kind_and_nop_none(tmp_path):
    from agent.bench.tasks import load_swe_tasks
    from agent.bench.validate import validate

    (jsonl,) = RepairSuite("train", seed=5, count=len(KINDS)).materialize(tmp_path / "suite")
    tasks = load_swe_tasks(jsonl)
    assert sorted(json.loads(line)["bug_kind"] for line in jsonl.read_text().splitlines()) == sorted(KINDS)
    found = validate(tasks, tmp_path / "work", concurrency=2)
    assert found == {t.instance_id: [] for t in tasks}
