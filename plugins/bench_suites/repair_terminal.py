"""The generated repair family as Harbor task folders: `terminal:repair-train` and `terminal:repair-heldout`.

The same instances as repair_suite.py's SWE-format suites (instance i of a split for a seed is the same package,
the same bug, the same issue; the splits share no function name), written the way terminal_suite.py's tasks are,
so one family measures an agent in both formats. `RepairTerminalSuite(split, seed, count)` writes, per instance:

    <instance_id>/task.toml        schema 1.4; [task].name glm5proof/repair-<split>-<i> loads as the SWE row's
                                   instance_id, so the two formats' reports line up; [metadata] seed, split,
                                   index and bug kind
    <instance_id>/instruction.md   the issue text, and where the package is
    <instance_id>/environment/     /app: the package and its visible tests as a git repository whose one commit
                                   is the SWE row's base_commit (same files, same date, same SHA), + a Dockerfile
    <instance_id>/tests/           test.sh + test_outputs.py run cases/ (the test files after the row's test
                                   patch, hidden case included) against /app: reward 1 when every test passes,
                                   FAIL_TO_PASS and PASS_TO_PASS alike
    <instance_id>/solution/        solve.sh applies fix.diff, the row's gold patch

What is the same for every instance (Dockerfile, test.sh, test_outputs.py, solve.sh, and task.toml and
instruction.md with @KEY@ placeholders) is data in repair_terminal_task/; only what varies is generated here.
"""

from __future__ import annotations

import re
from pathlib import Path

from plugins.bench_suites import gitrepo
from plugins.bench_suites.repair_family import Instance, generate
from plugins.bench_suites.repair_suite import RepairSuite, build_repo, graded_files
from plugins.bench_suites.swe_suite import SpecError
from plugins.bench_suites.terminal_suite import check_task, copy_task

TEMPLATE = Path(__file__).parent / "repair_terminal_task"
_PLACEHOLDER = re.compile(r"@([A-Z][A-Z_]*)@")


def fill(path: Path, values: dict[str, str]) -> None:
    """Replace @KEY@ in path in one pass (an issue that happened to contain @X@ is left as it is)."""

    def value(m: re.Match) -> str:
        if m.group(1) not in values:
            raise SpecError(f"{path}: nothing defines the placeholder {m.group(0)}")
        return values[m.group(1)]

    path.write_text(_PLACEHOLDER.sub(value, path.read_text(encoding="utf-8")), encoding="utf-8")


def write_task(inst: Instance, seed: int, index: int, task: Path) -> None:
    """Instance `index` of inst.split for `seed` as a Harbor task folder at task."""
    # the repository before the template: its commit must hold only the package (the Dockerfile beside it is
    # skipped by the local environment and deleted by the image, so /app's `git status` is clean either way)
    build_repo(inst, task / "environment")
    copy_task(TEMPLATE, task)
    # values land in TOML strings and numbers: generated identifiers only, never free text
    values = {"NAME": inst.instance_id.replace("__", "/", 1), "SPLIT": inst.split, "SEED": str(seed),
              "INDEX": str(index), "BUG_KIND": inst.bug.kind}  # fmt: skip
    fill(task / "task.toml", values)
    fill(task / "instruction.md", {"PACKAGE": inst.package, "ISSUE": inst.problem_statement})
    cases = {Path(p).name: text for p, text in graded_files(inst).items() if p.startswith("tests/")}
    gitrepo.write_files(task / "tests" / "cases", cases)
    fix = gitrepo.diff(inst.files(fixed=False), inst.files(fixed=True))
    gitrepo.write_files(task / "solution", {"fix.diff": fix})
    check_task(task)


class RepairTerminalSuite(RepairSuite):
    """RepairSuite's split, seed, count and names; task folders instead of repositories and a JSONL."""

    kind = "terminal"
    description = (
        "The generated one-line repair family of swe:repair-* as Harbor task folders (the same instances; the issue "
        "in instruction.md, the hidden test in tests/, the gold patch as solution/solve.sh)"
    )

    def build(self, tmp: Path, dest: Path) -> list[str]:
        names = []
        for i in range(self.count):
            inst = generate(self.seed, self.split, i)
            write_task(inst, self.seed, i, tmp / inst.instance_id)
            names.append(inst.instance_id)
        return names

    def outputs(self, dest: Path, names: list[str]) -> list[Path]:
        return [dest / n for n in names]
