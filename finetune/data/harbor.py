"""Harbor trial trajectories (ATIF, the Agent Trajectory Interchange Format, v1.x) -> Sessions.

An ATIF file: {"schema_version": "ATIF-v1.4", "session_id", "agent", "steps": [...]}; each step has a `source`
(system | user | agent), a `message`, and for agent steps `reasoning_content`, `tool_calls` [{tool_call_id,
function_name, arguments}], `observation` {"results": [{source_call_id, content}]} and `metrics` with, since
v1.3/v1.4, `completion_token_ids` and `prompt_token_ids` (then the sequence is those ids: TITO). An agent step
is one model call; its observation results become tool messages (or a user message when they answer no call).

In a Harbor job folder the trial's outcome is `result.json`'s `verifier_result.rewards.reward` (beside the
`agent/` folder holding trajectory.json): --min-reward filters on it, --only-resolved keeps reward >= 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.data.report import DataReport
from finetune.data.sequences import Call, Session
from finetune.data.trajectories import DataOptions, _ids, _valid_message


def is_atif(d) -> bool:
    return isinstance(d, dict) and str(d.get("schema_version", "")).startswith("ATIF") and "steps" in d


def _reward(traj: Path) -> float | None:
    for folder in (traj.parent, traj.parent.parent):
        p = folder / "result.json"
        if p.is_file():
            try:
                r = ((json.loads(p.read_text()).get("verifier_result") or {}).get("rewards") or {}).get("reward")
            except (OSError, json.JSONDecodeError, AttributeError):
                return None
            return float(r) if isinstance(r, (int, float)) else None
    return None


def read_atif(path: Path, d: dict, report: DataReport, opts: DataOptions) -> list[Session]:
    reward = _reward(path)
    if opts.only_resolved and not (reward is not None and reward >= 1.0):
        report.filtered["Harbor trials not resolved or unknown"] += 1
        return []
    if opts.min_reward is not None and not (reward is not None and reward >= opts.min_reward):
        report.filtered[f"Harbor trials with reward below {opts.min_reward} or unknown"] += 1
        return []
    try:
        return _atif_sessions(path, d, report)
    except (TypeError, AttributeError, KeyError, ValueError, RecursionError) as e:  # a trial file is outside data
        report.skip(f"{path}:1", f"not a readable ATIF trajectory ({type(e).__name__}: {str(e)[:120]})")
        return []


def _atif_sessions(path: Path, d: dict, report: DataReport) -> list[Session]:
    msgs: list[dict] = []
    calls: list[Call] = []
    steps = d.get("steps")
    if not isinstance(steps, list):
        report.skip(f"{path}:1", '"steps" is not a list')
        return []
    for i, step in enumerate(steps):
        where = f"{path}:step {step.get('step_id', i + 1) if isinstance(step, dict) else i + 1}"
        if not isinstance(step, dict) or step.get("source") not in ("system", "user", "agent"):
            report.skip(where, "a step needs a source: system, user or agent")
            return []
        if step["source"] != "agent":
            msgs.append({"role": step["source"], "content": str(step.get("message") or "")})
            continue
        m: dict = {"role": "assistant", "content": step.get("message") or ""}
        if step.get("reasoning_content"):
            m["reasoning_content"] = step["reasoning_content"]
        tcs = step.get("tool_calls") or []
        try:
            if tcs:
                m["tool_calls"] = [
                    {
                        "id": str(tc["tool_call_id"]),
                        "type": "function",
                        "function": {"name": tc["function_name"], "arguments": json.dumps(tc.get("arguments") or {})},
                    }
                    for tc in tcs
                ]
        except (KeyError, TypeError) as e:
            report.skip(where, f"bad tool call ({e})")
            return []
        if (why := _valid_message(m)) is not None:
            report.skip(where, f"bad agent step ({why})")
            return []
        metrics = step.get("metrics") or {}
        p, c = metrics.get("prompt_token_ids"), metrics.get("completion_token_ids")
        tito = _ids(p) and _ids(c)
        calls.append(Call(list(msgs), m, where, None, list(p) if tito else None, list(c) if tito else None))
        msgs.append(m)
        ids = {tc["id"] for tc in m.get("tool_calls", [])}
        for res in (step.get("observation") or {}).get("results") or []:
            content = str(res.get("content") or "") if isinstance(res, dict) else str(res)
            call_id = res.get("source_call_id") if isinstance(res, dict) else None
            if call_id in ids:
                msgs.append({"role": "tool", "tool_call_id": call_id, "content": content})
            else:
                msgs.append({"role": "user", "content": content})
    return [Session(calls, [], str(path))] if calls else []
