"""The expert: a scripted policy that solves the repair family's tasks from the conversation alone.

It plays the model's part of a `glm5 code` session: given the messages so far (OpenAI format), it returns the next
assistant message. It reads only what a model would see -- the issue in the first user message and the tool
results -- never the gold patch or the hidden test:

    1. read the file the issue names
    2. edit the one line: check that the line the issue quotes is in the named function in the read output (and
       nowhere else in the file), then replace it, as quoted, by the line the issue says it should be
    3. run the failing test the issue names with bash
    4. answer in one sentence (no tool call: the session ends, as a model's would)

With a slip rate, it first makes failed edits on some tasks -- 0, 1 or 2, drawn from the issue's text, so a task
gets the same session every time -- then the right one. A slip is one of a model's: the quoted line copied with a
wrong digit, name or operator (so it is not in the file), or the path left out. The edit tool refuses the first
(the session records `failed: "call"`), the agent loop the second before it runs (a `format_error`: a required
argument is missing), and `glm5 finetune sft` keeps either as context but does not train it (GLM-5 masks
erroneous segments): SFT learns to correct a failed edit from the error message, never to make one.

Its sessions, recorded by `glm5 bench` like any model's, are the SFT stage's expert trajectories. An issue it
cannot parse, or a file whose line it cannot find, ends the session with a message saying so (the trial is then
unresolved, and SFT's default --only-resolved leaves it out).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

# where: "`f` in `path`" or "`f` (path)"
_WHERE = re.compile(r"`(?P<f>[A-Za-z_]\w*)` (?:in `|\()(?P<path>[\w./-]+\.py)")
_TEST = re.compile(r"`(?P<test>[\w./-]+\.py::\w+)`")
# what: the line as it is and as it should be, in each phrasing the family uses
_WHAT = (
    re.compile(r"line `(?P<old>[^`]+)` should be `(?P<new>[^`]+)`"),
    re.compile(r"`(?P<old>[^`]+)` should read `(?P<new>[^`]+)`"),
)
_NUMBERED = re.compile(r"^\s*\d+\t(.*)$")
PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider"


@dataclass(frozen=True)
class Issue:
    function: str
    path: str
    old: str
    new: str
    test: str


def parse_issue(text: str) -> Issue | None:
    """The facts the family's issue text states, or None when it is not one of ours."""
    where, test = _WHERE.search(text), _TEST.search(text)
    what = next((m for p in _WHAT if (m := p.search(text))), None)
    if not (where and test and what):
        return None
    return Issue(where["f"], where["path"], what["old"], what["new"], test["test"])


def fix_line(file_lines: list[str], issue: Issue) -> tuple[str, str] | None:
    """The edit's (old_string, new_string): the lines the issue quotes, when the buggy one is inside
    issue.function and occurs once in the file (the edit tool replaces a unique string); else None."""
    start = next((i for i, line in enumerate(file_lines) if line.startswith(f"def {issue.function}(")), None)
    if start is None or "\n".join(file_lines).count(issue.old) != 1:
        return None
    for line in file_lines[start + 1 :]:
        if line and not line[0].isspace():
            break
        if issue.old in line:
            return issue.old, issue.new
    return None


def _call(name: str, args: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _draw(text: str, salt: str) -> float:
    """A number in [0, 1) fixed by the text: the same task draws the same slips in every run."""
    return int(hashlib.sha256(f"{salt}\0{text}".encode()).hexdigest()[:12], 16) / 16**12


def slips_for(issue_text: str, rate: float) -> int:
    """How many failed edits come before the right one: 0 with probability 1 - rate, else 1 (70%) or 2 (30%)."""
    u = _draw(issue_text, "slips")
    return 0 if u >= rate else 2 if u < 0.3 * rate else 1


def slip_edit(issue: Issue, file_text: str, k: int, issue_text: str) -> dict[str, Any]:
    """The k-th failed edit's arguments: the quoted line with one digit, name or operator changed so that it is
    nowhere in the file, or (when no change is absent from the file, and on some draws) the path left out."""
    old = issue.old
    names = sorted(set(re.findall(r"[A-Za-z_]\w*", file_text)) - {"def", "return", "for", "in", "if", "else"})
    swaps = {"+": "-", "-": "+", "*": "+", "<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!="}
    candidates = []
    for m in re.finditer(r"\d+|[A-Za-z_]\w*|<=|>=|==|[-+*<>]", old):
        tok = m.group()
        if tok.isdigit():
            subs = [str(int(tok) + d) for d in (1, -1, 10) if int(tok) + d >= 0]
        elif tok in swaps:
            subs = [swaps[tok]]
        else:
            subs = [n for n in names if n != tok][:6]
        candidates += [old[: m.start()] + sub + old[m.end() :] for sub in subs]
    candidates = [c for c in candidates if c not in file_text]
    u = _draw(issue_text, f"slip{k}")
    if not candidates or u < 0.2:
        return {"old_string": old, "new_string": issue.new}  # no path
    return {"path": issue.path, "old_string": candidates[int(u * len(candidates)) % len(candidates)],
            "new_string": issue.new}  # fmt: skip


def next_message(messages: list[dict[str, Any]], slip_rate: float = 0.0) -> dict[str, Any]:
    """The expert's next assistant message (OpenAI format) after `messages`; `slip_rate`: the share of tasks on
    which it first makes failed edits (see the module's text)."""
    users = [m for m in messages if m.get("role") == "user"]
    issue_text = _text(users[0].get("content")) if users else ""
    issue = parse_issue(issue_text)
    if issue is None:
        return {"role": "assistant", "content": "I cannot tell from the issue which line to change."}
    calls = [tc for m in messages if m.get("role") == "assistant" for tc in (m.get("tool_calls") or [])]
    done = [tc["function"]["name"] for tc in calls]
    results = [m for m in messages if m.get("role") == "tool"]
    # each of its calls' result, in order (one call per message, answered before the next)
    result = [_text(m.get("content")) for m in results] + [""] * len(calls)
    n = len(calls)
    if "read" not in done:
        return {"role": "assistant", "content": None, "tool_calls": [_call("read", {"path": issue.path}, n)]}
    edits = [result[i] for i, name in enumerate(done) if name == "edit"]
    if all(r.startswith("error:") for r in edits):  # no edit has been made yet
        listing = result[done.index("read")]
        lines = [m.group(1) for m in map(_NUMBERED.match, listing.splitlines()) if m]
        found = fix_line(lines, issue)
        if found is None:
            return {"role": "assistant", "content": f"I could not find the line to change in `{issue.function}`."}
        old, new = found
        if len(edits) < slips_for(issue_text, slip_rate):
            args = slip_edit(issue, "\n".join(lines), len(edits), issue_text)
        else:
            args = {"path": issue.path, "old_string": old, "new_string": new}
        return {"role": "assistant", "content": None, "tool_calls": [_call("edit", args, n)]}
    if "bash" not in done:
        args = {"command": f"{PYTEST} {issue.test}"}
        return {"role": "assistant", "content": None, "tool_calls": [_call("bash", args, n)]}
    log = _text(results[-1].get("content")) if results else ""
    if re.search(r"\b\d+ passed\b", log) and not re.search(r"\b\d+ (failed|error)", log):
        return {"role": "assistant", "content": f"Fixed `{issue.function}` in `{issue.path}`; `{issue.test}` passes."}
    return {"role": "assistant", "content": f"I changed `{issue.function}` but `{issue.test}` still fails."}
