"""The trajectory: one session's record, JSONL, appended and fsynced after every step.

The trajectory *is* the session: `glm5 code --resume` rebuilds the conversation from it, `glm5 finetune` turns
it into token ids and loss masks, `glm5 bench` reads its outcome labels. Schema `glm5-trajectory/1`, one JSON
object per line, each with a `type` and a wall-clock `ts`:

    session      first line. id, schema, created, root, cwd, provider, model, base_url, glm5 version,
                 git {head, branch}, tools (OpenAI tool schemas offered to the model), settings summary.
    message      one conversation message in OpenAI format: {"index": i, "message": {...}}. Assistant messages
                 keep `reasoning_content` and `tool_calls`; tool messages carry `tool_call_id`. `index` is the
                 position in the live conversation, so a later `message` at a lower index means the list was
                 cut there (rewind) and grows again from that point.
    turn         {"turn", "n_messages", "checkpoint"}: a user turn begins; the conversation had n_messages and
                 the working tree was snapshot `checkpoint` (what /undo and /rewind go back to).
    model_call   {"step", "n_messages" (the prompt was messages[:n_messages]), "response": raw response in the
                 non-streamed OpenAI shape incl. reasoning_content, tool_calls, logprobs, token_ids and
                 prompt_token_ids when the server sent them, "usage", "latency_s", "cost_usd"}
    tool         {"step", "call_id", "name", "arguments", "decision" (allow | approved | denied | blocked |
                 format_error: an unknown tool, unparsable arguments or a required one missing, then `arguments`
                 is the raw string | unasked: the tool refused the call before any approval, `failed` "call"),
                 "reason" and "user_message" (a refusal's why, and what the user said with their no),
                 "result" (text shown to the model), "is_error" (also a command's nonzero exit), "failed"
                 (only when the call failed: "call", the tool refused it as made -- an argument of the wrong
                 type, an old_string not in the file; "crash", the tool itself broke), "duration_s",
                 "checkpoint" (hidden git ref taken before the call), "commit_before", "commit_after" (snapshot
                 commits of the working tree; equal when the call changed nothing)}
    compaction   {"summary", "messages": the full new conversation}: the conversation restarts from here.
    rewind       {"to_turn", "n_messages", "checkpoint", "saved_as"}: the conversation is cut to n_messages and
                 the working tree restored; `saved_as` is a snapshot of the tree before the rewind.
    resume       {"n_messages"}: the session was resumed (by a later process) with this conversation.
    model_switch {"model"}: /model changed the model from here on.
    permission_rule {"rule", "kind", "scope" (session | repo | user)}: an "always" answer allowed this rule.
    outcome      labels: {"tests": [{"command", "returncode", "passed"}], "diff_kept": bool, ...}
    end          {"exit_status", "stats": {steps, prompt_tokens, completion_tokens, cost_usd}, "final": text}

A process killed mid-step leaves at most one torn last line; readers skip it. Every string is passed through
`Redactor` before it is written.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.provenance import is_ours, last_mac, seal
from agent.redact import Redactor

SCHEMA = "glm5-trajectory/1"


class TrajectoryWriter:
    """Appends records; each `write` reaches the disk (flush + fsync) before it returns."""

    def __init__(self, path: Path, redactor: Redactor | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.redact = redactor or Redactor()
        self._lock = threading.Lock()  # the TUI may close the session while its worker thread still writes
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the session's life
        # every record is sealed into this machine's chain (agent/provenance.py), continuing an existing file's
        self._prev = last_mac(read_records(self.path)) if self.path.stat().st_size else ""

    def write(self, type_: str, **fields: Any) -> dict[str, Any]:
        record = {"type": type_, "ts": round(time.time(), 3), **fields}
        record = self.redact(record)
        record = json.loads(json.dumps(record, ensure_ascii=False, default=str))  # as a reader will see it
        with self._lock:
            if self._f.closed:
                return record
            record["mac"] = seal(self._prev, record)
            self._prev = record["mac"]
            line = json.dumps(record, ensure_ascii=False) + "\n"
            self._f.write(line)
            self._f.flush()
            os.fsync(self._f.fileno())
        return record

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """All complete records; a torn last line (crash mid-write) is skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError):  # torn, or a line built to crash a parser (nesting, huge numbers)
                continue
    return out


def file_is_ours(path: Path) -> bool:
    """Every record of the trajectory at `path` carries this machine's chain (agent/provenance.py)."""
    try:
        return is_ours(read_records(path))
    except (OSError, ValueError):
        return False


class Trajectory:
    """A trajectory read back: the header, the records, and the conversation as it stood at the end."""

    def __init__(self, records: list[dict[str, Any]]):
        if not records or records[0].get("type") != "session":
            raise ValueError("not a glm5 trajectory: the first record is not a `session` header")
        self.header = records[0]
        self.records = records

    @classmethod
    def load(cls, path: Path) -> Trajectory:
        return cls(read_records(Path(path)))

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.header.get("tools") or []

    def _replay(self) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Yield (record, conversation after applying it)."""
        msgs: list[dict[str, Any]] = []
        for r in self.records:
            t = r.get("type")
            if t == "message":
                i = r.get("index", len(msgs))
                del msgs[i:]
                msgs.append(r["message"])
            elif t == "compaction":
                msgs = list(r["messages"])
            elif t == "rewind":
                del msgs[r["n_messages"] :]
            yield r, msgs

    def messages(self) -> list[dict[str, Any]]:
        """The conversation as it stood at the end, in OpenAI format (what --resume continues from)."""
        msgs: list[dict[str, Any]] = []
        for _, m in self._replay():
            msgs = m
        return list(msgs)

    def samples(self) -> Iterator[dict[str, Any]]:
        """One training sample per model call: the exact prompt messages, the tools, and the response message."""
        for r, msgs in self._replay():
            if r.get("type") == "model_call":
                n = r.get("n_messages", len(msgs))
                choice = (r.get("response", {}).get("choices") or [{}])[0]
                yield {
                    "messages": list(msgs[:n]),
                    "tools": self.tools,
                    "response": choice.get("message", {}),
                    "token_ids": choice.get("token_ids"),
                    "logprobs": choice.get("logprobs"),
                    # vLLM puts the prompt's ids beside the choices, sglang inside the choice
                    "prompt_token_ids": r.get("response", {}).get("prompt_token_ids") or choice.get("prompt_token_ids"),
                    "step": r.get("step"),
                }

    def turns(self) -> list[dict[str, Any]]:
        """The user turns that can still be rewound (a compaction forgets them, a rewind drops them)."""
        turns: list[dict[str, Any]] = []
        for r in self.records:
            t = r.get("type")
            if t == "turn":
                turns.append({k: r[k] for k in ("turn", "n_messages", "checkpoint") if k in r})
            elif t == "rewind":
                del turns[len(turns) - r.get("n_turns", 1) :]
            elif t == "compaction":
                turns = []
        return turns

    def usage(self) -> dict[str, Any]:
        p = sum((r.get("usage") or {}).get("prompt_tokens") or 0 for r in self.records if r.get("type") == "model_call")
        c = sum(
            (r.get("usage") or {}).get("completion_tokens") or 0 for r in self.records if r.get("type") == "model_call"
        )
        cost = sum(r.get("cost_usd") or 0.0 for r in self.records if r.get("type") == "model_call")
        steps = sum(1 for r in self.records if r.get("type") == "model_call")
        return {"prompt_tokens": p, "completion_tokens": c, "cost_usd": cost, "steps": steps}

    def outcome(self) -> dict[str, Any]:
        labels: dict[str, Any] = {}
        for r in self.records:
            if r.get("type") == "outcome":
                labels.update(r.get("labels", {}))
        return labels

    def end(self) -> dict[str, Any] | None:
        ends = [r for r in self.records if r.get("type") == "end"]
        return ends[-1] if ends else None
