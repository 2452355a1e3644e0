"""The generated repair family as SWE-bench-format suites: `swe:repair-train` and `swe:repair-heldout`.

`RepairSuite(split, seed, count)` materializes `count` instances of repair_family.py's `split` for `seed` into
dest/repos/<instance>/ (one small git repository each, its only commit the buggy state) and dest/repair-<split>.jsonl
(one SWE-bench row a line, the same fields as swe:builtin's, plus `bug_kind`). The gold patch fixes the one line;
the test patch appends the hidden `test_<f>_more` case, so FAIL_TO_PASS is the visible failing test and the hidden
one, and PASS_TO_PASS every other function's test. Registered with the defaults (seed 0, 200 train, 50 held-out);
the training proof builds its own with other seeds and counts.
"""

from __future__ import annotations

import json
from pathlib import Path

from plugins.bench_suites import gitrepo
from plugins.bench_suites.repair_family import SPLITS, Instance, generate
from plugins.bench_suites.suite import BuiltinSuite

DEFAULT_SEED = 0
DEFAULT_COUNTS = {"train": 200, "heldout": 50, "dev": 50}
DATE = "2026-01-05T12:00:00+00:00"
TEST_CMD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider tests"


def build_repo(inst: Instance, repo: Path) -> str:
    """inst's repository at repo, its only commit the buggy state; the commit's SHA (the same in both formats)."""
    gitrepo.init(repo)
    gitrepo.write_files(repo, inst.files(fixed=False))
    return gitrepo.commit(repo, f"{inst.package}: helpers and their tests", DATE)


def graded_files(inst: Instance) -> dict[str, str]:
    """The buggy files with the hidden `test_<f>_more` case appended: the state the tests are graded in."""
    before = inst.files(fixed=False)
    path, hidden = inst.hidden_test
    return {**before, path: before[path] + hidden}


def instance_row(inst: Instance, repo: Path, final: Path) -> dict:
    """Build inst's repository at repo (it will live at final); its SWE-bench row."""
    before, fixed, tested = inst.files(fixed=False), inst.files(fixed=True), graded_files(inst)
    base = build_repo(inst, repo)
    return {
        "repo": str(final),
        "instance_id": inst.instance_id,
        "base_commit": base,
        "patch": gitrepo.diff(before, fixed),
        "test_patch": gitrepo.diff(before, tested),
        "problem_statement": inst.problem_statement,
        "hints_text": "",
        "created_at": DATE,
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps(inst.fail_to_pass),
        "PASS_TO_PASS": json.dumps(inst.pass_to_pass),
        "environment_setup_commit": base,
        "difficulty": "<15 min fix",
        "bug_kind": inst.bug.kind,
        "test_cmd": TEST_CMD,
        "log_parser": "pytest",
    }


class RepairSuite(BuiltinSuite):
    kind = "swe"
    description = (
        "Generated one-line repair tasks (wrong operator, off by one, wrong comparison, wrong return value) in "
        "random small Python packages; train and held-out splits share no function name"
    )

    def __init__(self, split: str, seed: int = DEFAULT_SEED, count: int | None = None):
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
        count = DEFAULT_COUNTS[split] if count is None else count
        if count < 1:
            raise ValueError(f"count must be >= 1, not {count}")
        self.split, self.seed, self.count = split, seed, count
        default = seed == DEFAULT_SEED and count == DEFAULT_COUNTS[split]
        # the name is the marker's key: another seed or count in the same folder is a different suite, rebuilt
        self.name = f"repair-{split}" if default else f"repair-{split}-s{seed}-n{count}"

    @property
    def jsonl(self) -> str:
        return f"repair-{self.split}.jsonl"

    def instances(self) -> list[Instance]:
        return [generate(self.seed, self.split, i) for i in range(self.count)]

    def build(self, tmp: Path, dest: Path) -> list[str]:
        rows = [
            instance_row(inst, tmp / "repos" / inst.instance_id, dest / "repos" / inst.instance_id)
            for inst in self.instances()
        ]
        with open(tmp / self.jsonl, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return ["repos", self.jsonl]

    def outputs(self, dest: Path, names: list[str]) -> list[Path]:
        return [dest / self.jsonl]
