"""A trial's grade and the SWE-bench resolution rule on a parsed status map (no I/O).

Resolved iff every FAIL_TO_PASS test passes (PASSED or XFAIL) and every PASS_TO_PASS test is maintained (PASSED,
XFAIL or SKIPPED); a test absent from the log has failed (`swebench.harness.grading`). An infra error is neither a
pass nor a failure: `resolved` is None and the trial is kept out of the score. grading.py does the I/O (apply,
run, parse, the verifier's reward file); harness_specs.py gives the same Grade from the official harness's rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agent.bench.log_parsers import PASSED, SKIPPED, XFAIL

RESOLVED, UNRESOLVED, INFRA_ERROR = "resolved", "unresolved", "infra_error"
MISSING = "MISSING"  # a listed test the log does not mention


@dataclass
class Grade:
    status: str  # resolved | unresolved | infra_error
    resolved: bool | None  # None for an infra error: unknown, never counted as a failure or a pass
    reward: float = 0.0
    tests: dict[str, str] = field(default_factory=dict)  # each FAIL_TO_PASS / PASS_TO_PASS test's status
    fail_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    pass_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    reason: str = ""
    patch_applied: bool | None = None
    apply_method: str | None = None
    test_returncode: int | None = None
    flaky_tests: list[str] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)  # terminal: named rewards
    log: str = field(default="", repr=False)  # the test output (written to test_output.txt, not report.json)

    @property
    def failing_tests(self) -> list[str]:
        return self.fail_to_pass["failure"] + self.pass_to_pass["failure"]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("log")
        return d


def infra(reason: str, log: str = "") -> Grade:
    return Grade(INFRA_ERROR, None, 0.0, reason=reason, log=log)


# -- the resolution rule ---------------------------------------------------------------------------------------


def _key(case: str, statuses: dict[str, str]) -> str | None:
    """The log's name for `case`; a parametrized id cut short in the dataset matches by prefix when unambiguous."""
    if case in statuses:
        return case
    if case.count("[") > case.count("]"):
        hits = [k for k in statuses if k.startswith(case)]
        if hits and len({statuses[k] in (PASSED, XFAIL) for k in hits}) == 1:
            return hits[0]
    return None


def judge(fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...], statuses: dict[str, str]) -> Grade:
    """Apply the SWE-bench rule to a parsed status map (no I/O)."""
    g = Grade(UNRESOLVED, False)
    for group, cases, ok in (
        (g.fail_to_pass, fail_to_pass, (PASSED, XFAIL)),
        (g.pass_to_pass, pass_to_pass, (PASSED, XFAIL, SKIPPED)),
    ):
        for case in cases:
            k = _key(case, statuses)
            status = statuses[k] if k is not None else MISSING
            g.tests[case] = status
            group["success" if status in ok else "failure"].append(case)
    if not g.failing_tests:
        g.status, g.resolved, g.reward = RESOLVED, True, 1.0
    else:
        g.reason = "failing: " + ", ".join(g.failing_tests[:10]) + (" ..." if len(g.failing_tests) > 10 else "")
    return g
