"""Outcome labels: what a session achieved, written at its end for the bench and for training.

    test_run(command, result)  a bash call that ran a test runner -> {"command", "returncode", "passed"}
    labels(agent)              {"tests", "tests_passed", "undone_turns", "files_changed", "diff_kept",
                               "commit_start", "commit_end"}

Knows nothing of the loop; reads the agent's records and checkpoints.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from agent.trajectory import read_records

if TYPE_CHECKING:
    from agent.loop import Agent
    from agent.tools.base import ToolResult

TEST_COMMAND = re.compile(
    r"(^|[\s;&|(])(pytest|py\.test|python3? -m (pytest|unittest)|tox|nox|(npm|yarn|pnpm|bun)( run)? test|"
    r"cargo test|go test|make (test|check)|ctest|mvn test|gradle test|\./gradlew test)\b"
)


def test_run(command: str, result: ToolResult) -> dict[str, Any] | None:
    """The label of a test command's run, or None when `command` runs no test runner."""
    if not TEST_COMMAND.search(command):
        return None
    rc = result.data.get("returncode")
    return {"command": command, "returncode": rc, "passed": rc == 0}


def labels(agent: Agent) -> dict[str, Any]:
    out: dict[str, Any] = {"tests": agent.tests, "undone_turns": agent.undone_turns}
    if agent.tests:
        out["tests_passed"] = agent.tests[-1]["passed"]
    cps = agent.checkpoints
    if cps and cps.enabled:
        end = cps.snapshot("session end")
        first = first_checkpoint(agent)
        if end and first:
            changed = cps.changed_files(first, end.commit)
            out.update(files_changed=changed, diff_kept=bool(changed), commit_start=first, commit_end=end.commit)
    return out


def first_checkpoint(agent: Agent) -> str | None:
    """The working tree's snapshot at the session's first turn (in this or an earlier process)."""
    for r in read_records(agent.writer.path):
        if r.get("type") == "turn" and r.get("checkpoint"):
            return r["checkpoint"]
    return None
