"""Outcome labels of test runs: did a bash call that ran a test runner pass?

    label_test_run(command, result)  a bash call that ran a test runner -> {"command", "returncode", "passed" (True,
                               False or None: unknown), "status" (passed | failed | unknown), "evidence"}

The agent keeps these labels (Agent.tests) and writes them with the files changed at its end (Agent.labels).
Knows nothing of the loop.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.tools.base import ToolResult

TEST_COMMAND = re.compile(
    r"(^|[\s;&|(])(pytest|py\.test|python3? -m (pytest|unittest)|tox|nox|(npm|yarn|pnpm|bun)( run)? test|"
    r"cargo test|go test|make (test|check)|ctest|mvn test|gradle test|\./gradlew test)\b"
)


PASSED, FAILED, UNKNOWN = "passed", "failed", "unknown"

# Summary lines of the common runners: (pattern, what it says). Counts of failures / errors mean failed.
_PYTEST = re.compile(r"=*[ ]*((?:\d+ \w+(?: \w+)?(?:, )?)+) in [\d.]+s")  # "1 failed, 2 passed in 0.1s"
_COUNT = re.compile(r"(\d+) (failed|passed|errors?|xfailed|xpassed|skipped|deselected|warnings?)")
_SUMMARIES = (
    (re.compile(r"^FAILED \((?:failures|errors)=\d+", re.M), FAILED),  # unittest
    (re.compile(r"^OK(?: \(.*\))?$", re.M), PASSED),  # unittest
    (re.compile(r"^test result: FAILED\.", re.M), FAILED),  # cargo
    (re.compile(r"^test result: ok\.", re.M), PASSED),  # cargo
    (re.compile(r"^Tests:.*\b\d+ failed", re.M), FAILED),  # jest / vitest
    (re.compile(r"^--- FAIL:|^FAIL\s", re.M), FAILED),  # go
    (re.compile(r"^ERROR: InvocationError|^\s*\w+: FAIL", re.M), FAILED),  # tox
)
# Where the exit status is no longer the runner's: a pipeline (the last command's status, unless pipefail), or a
# runner followed by `;`, `||`, `&` or a newline (what ran after it decides the status).
_PIPE = re.compile(r"(?<!\|)\|(?!\|)")
_AFTER = re.compile(r"\|\||;|(?<!&)&(?!&)|\n")
_FD_DUP = re.compile(r"\d*>&\d+")  # 2>&1 joins streams; not a background `&`


def summary(output: str) -> tuple[str, str] | None:
    """(PASSED | FAILED, the line that says so) from the runner's summary in `output`, or None if there is none.
    The last summary wins: a run's output may quote earlier ones."""
    found: list[tuple[int, str, str]] = []
    for m in _PYTEST.finditer(output):
        counts = {w.rstrip("s"): int(n) for n, w in _COUNT.findall(m.group(1))}
        if counts.get("failed") or counts.get("error"):
            found.append((m.start(), FAILED, m.group(0).strip("= ")))
        elif counts.get("passed") or counts.get("xpassed"):
            found.append((m.start(), PASSED, m.group(0).strip("= ")))
    for pattern, status in _SUMMARIES:
        for m in pattern.finditer(output):
            found.append((m.start(), status, m.group(0).strip()))
    if not found:
        return None
    # a run that printed any failure summary failed, even if a later "ok" line (another package) follows
    if any(s == FAILED for _, s, _ in found):
        return max((f for f in found if f[1] == FAILED), key=lambda f: f[0])[1:]
    return max(found, key=lambda f: f[0])[1:]


def exit_status_is_the_runners(command: str) -> bool:
    """True when the command's exit status is the test runner's: no pipeline without pipefail, and nothing after
    the runner but `&&`-joined commands (which run only if it passed)."""
    command = _FD_DUP.sub(" ", command)
    m = TEST_COMMAND.search(command)
    if m is None:
        return False
    rest = command[m.end() :]
    if _PIPE.search(command) and "pipefail" not in command:
        return False
    return not _AFTER.search(rest)


def label_test_run(command: str, result: ToolResult) -> dict[str, Any] | None:
    """The label of a test command's run, or None when `command` runs no test runner.

    `status` is FAILED or PASSED when the runner's summary line says so, else from the exit status when that is
    the runner's own, else UNKNOWN (`passed` None): `pytest | tail -5` exits 0 whatever pytest said."""
    if not TEST_COMMAND.search(command):
        return None
    rc = result.data.get("returncode")
    said = summary(result.output)
    trusted_rc = rc is not None and exit_status_is_the_runners(command)
    if said is not None:
        status, line = said
        if status == PASSED and trusted_rc and rc != 0:
            status = FAILED  # the runner itself failed the run (a coverage floor, a crash after the summary)
    elif trusted_rc:
        status, line = (PASSED if rc == 0 else FAILED), f"exit code {rc}"
    else:
        status, line = UNKNOWN, "no summary line, and the exit status is not the test runner's"
    passed = {PASSED: True, FAILED: False}.get(status)
    return {"command": command, "returncode": rc, "passed": passed, "status": status, "evidence": line}
