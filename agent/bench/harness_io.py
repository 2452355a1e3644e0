"""The official SWE-bench harness's own file formats, out and in, so a team can check glm5's grades against it.

Out: `predictions` -> the harness's predictions JSONL (`instance_id`, `model_name_or_path`, `model_patch`), one
line per task (its first attempt), the patch being the trial's patch.diff: `swebench eval ... -p preds.jsonl`.
In: `read_harness_report` reads the harness's run report (`<model>.<run_id>.json`: resolved_ids, unresolved_ids,
error_ids, empty_patch_ids, ...) and `compare_with_harness` sets it beside a glm5 run, instance by instance.
What it does not do: run the harness (that is `swebench eval`, with docker).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from agent.bench.reports import load_runs

HARNESS_SETS = ("resolved_ids", "unresolved_ids", "error_ids", "empty_patch_ids", "incomplete_ids")
MAX_PATCH = 16 * 2**20


def _read_patch(trial_dir: str) -> str:
    """The trial's patch.diff, a regular file only (never a link out of the run folder), "" when absent."""
    try:
        fd = os.open(Path(trial_dir) / "patch.diff", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(MAX_PATCH).decode("utf-8", errors="replace")


def model_name(config: dict[str, Any]) -> str:
    agent = config.get("agent") or {}
    name = agent.get("model") or agent.get("agent") or "glm5"
    return f"glm5-{name}" if agent.get("agent") in (None, "glm5") and not str(name).startswith("glm5") else str(name)


def predictions(folders: list[Path], name: str | None = None) -> list[dict[str, str]]:
    """One harness prediction per task: its first attempt's patch (infra errors included: the harness grades
    every prediction it is given; an empty patch is the harness's `empty_patch`)."""
    config, ids, results = load_runs([Path(f) for f in folders])
    label = name or model_name(config)
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["instance_id"] not in first or int(r["attempt"]) < int(first[r["instance_id"]]["attempt"]):
            first[r["instance_id"]] = r
    return [{"instance_id": i, "model_name_or_path": label, "model_patch": _read_patch(first[i].get("trial_dir", ""))}
            for i in ids if i in first]  # fmt: skip


def write_predictions(folders: list[Path], dest: Path, name: str | None = None) -> int:
    rows = predictions(folders, name)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, dest)
    return len(rows)


def read_harness_report(path: Path) -> dict[str, str]:
    """instance_id -> the harness's verdict (resolved, unresolved, error, empty_patch, incomplete)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable harness report ({e})") from None
    if not isinstance(data, dict) or not any(isinstance(data.get(k), list) for k in HARNESS_SETS):
        raise ValueError(f"{path}: not a SWE-bench harness run report (no {', '.join(HARNESS_SETS[:3])})")
    out: dict[str, str] = {}
    for key in HARNESS_SETS:  # resolved first: an id in two lists keeps the first
        for i in data.get(key) or []:
            out.setdefault(str(i), key.removesuffix("_ids"))
    return out


def compare_with_harness(folders: list[Path], harness_report: Path) -> dict[str, Any]:
    """glm5's first attempt at each task beside the harness's verdict on the same task."""
    _, ids, results = load_runs([Path(f) for f in folders])
    harness = read_harness_report(harness_report)
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["instance_id"] not in first or int(r["attempt"]) < int(first[r["instance_id"]]["attempt"]):
            first[r["instance_id"]] = r
    rows, alike, compared = [], 0, 0
    for i in sorted(set(first) | set(harness)):
        g = first.get(i)
        ours = None if g is None else g["status"]
        theirs = harness.get(i)
        both = g is not None and g["resolved"] is not None and theirs in ("resolved", "unresolved", "empty_patch")
        same = both and (g["resolved"] is True) == (theirs == "resolved")
        compared += both
        alike += bool(same)
        rows.append({"instance_id": i, "glm5": ours, "harness": theirs, "agree": same if both else None})
    return {"compared": compared, "agree": alike, "disagree": [r for r in rows if r["agree"] is False],
            "only_glm5": [r["instance_id"] for r in rows if r["harness"] is None],
            "only_harness": [r["instance_id"] for r in rows if r["glm5"] is None], "instances": rows}  # fmt: skip
