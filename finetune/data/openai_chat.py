"""Conversations in OpenAI's chat format -> Sessions: OpenAI chat JSONL and mini-swe-agent `.traj.json`.

OpenAI chat JSONL (TRL's and OpenAI fine-tuning's format): one {"messages": [...], "tools": [...]} per line.
Every assistant message is a target unless it carries `"weight": 0` (OpenAI's per-message switch).

mini-swe-agent writes one `<instance>.traj.json` per run: {"info": {"exit_status", "submission", ...},
"messages": [...OpenAI messages with an `extra` field...], "trajectory_format": "mini-swe-agent-1.x"}. Its
actions are bash blocks in the assistant's text (or tool calls for tool-calling models); both render as they
are. It records no test outcome, so an outcome filter (--only-resolved, --min-reward) leaves it out as unknown.
"""

from __future__ import annotations

from pathlib import Path

from finetune.data.jsonl import UNREAD, json_file, jsonl_rows
from finetune.data.report import DataReport
from finetune.data.sequences import Call, Session
from finetune.data.trajectories import DataOptions, _valid_message

ROLES = ("system", "user", "assistant", "tool")
_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")


def conversation_session(messages: list, tools: list, where: str, report: DataReport) -> Session | None:
    """One conversation -> a Session whose calls are its assistant messages (None if a message is bad)."""
    if not isinstance(messages, list) or not messages:
        report.skip(where, "no `messages` list")
        return None
    msgs = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            report.skip(where, f"message {i}: role must be one of {', '.join(ROLES)}")
            return None
        clean = {k: m[k] for k in _KEYS if k in m}
        if (why := _valid_message(clean)) is not None:
            report.skip(where, f"message {i}: {why}")
            return None
        msgs.append((clean, m.get("weight", 1) != 0))
    plain = [m for m, _ in msgs]
    calls = [Call(plain[:i], m, where, trained=w) for i, (m, w) in enumerate(msgs) if m["role"] == "assistant"]
    if not calls:
        report.filtered["conversations without an assistant message"] += 1
        return None
    return Session(calls, list(tools or []), where)


def read_chat_jsonl(path: Path, report: DataReport, opts: DataOptions) -> list[Session]:
    out = []
    for n, row, bad in jsonl_rows(path, errors="replace"):
        where = f"{path}:{n}"
        if bad is not None:
            report.skip(where, bad)
            continue
        if not isinstance(row, dict):
            report.skip(where, 'expected {"messages": [...], "tools": [...]}')
            continue
        if opts.only_resolved or opts.min_reward is not None:
            report.filtered["conversations with an unknown outcome"] += 1
            continue
        s = conversation_session(row.get("messages"), row.get("tools") or [], where, report)
        if s is not None:
            out.append(s)
    return out


def read_mini_swe_agent(path: Path, report: DataReport, opts: DataOptions) -> list[Session]:
    d = json_file(path, report)
    if d is UNREAD:
        return []
    if not isinstance(d, dict) or not isinstance(d.get("messages"), list):
        report.skip(f"{path}:1", "not a mini-swe-agent trajectory (no `messages`)")
        return []
    if opts.only_resolved or opts.min_reward is not None:
        report.filtered["mini-swe-agent runs with an unknown outcome"] += 1
        return []
    # Messages of other roles (v2's final "exit" record) are the harness's, not the conversation's.
    msgs = [m for m in d["messages"] if isinstance(m, dict) and m.get("role") in ROLES]
    s = conversation_session(msgs, d.get("tools") or [], f"{path}:1", report)
    return [s] if s is not None else []
