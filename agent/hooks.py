"""Hooks: user commands run at points of the agent's life, with Claude Code's names and I/O.

Events: SessionStart, UserPromptSubmit, PreToolUse, PostToolUse, Stop, PreCompact. Settings:

    [hooks]
    PreToolUse = [{ matcher = "bash|write", command = "python check.py", timeout = 30 }]

`matcher` is a regex on the tool name (tool events only; empty or missing matches all). The command runs with
`bash -c` in the repository, on the host (hooks are the user's own: an untrusted repository's are ignored), with
the environment commands get (no keys; an entry's `pass_env = ["NAME"]` and `env = {...}` add to it, as an MCP
server's do), and gets the event as JSON on stdin: {"hook_event_name", "session_id", "cwd",
"transcript_path", + event fields ("tool_name", "tool_input", "tool_response", "prompt", ...)}.
Exit 0: go on; stdout of SessionStart and UserPromptSubmit hooks is added to the model's context.
Exit 2: block: the call (PreToolUse), the prompt (UserPromptSubmit), stopping (Stop: the agent continues with
stderr as its instruction) or compaction (PreCompact); stderr is fed back to the model.
Other exit codes: a warning; the agent goes on.
A hook that runs the repository's code (its tests, a tool from its .venv) runs what the model may have edited,
outside the sandbox: that is the hook's nature, as in Claude Code.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import host_path
from agent.child_env import scrubbed_env

EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "PreCompact")
TOOL_EVENTS = ("PreToolUse", "PostToolUse")


@dataclass
class HookOutcome:
    blocked: bool = False
    message: str = ""  # stderr of the blocking hook(s): what the model is told
    context: str = ""  # stdout to add to the model's context (SessionStart, UserPromptSubmit)
    warnings: list[str] = field(default_factory=list)


class Hooks:
    def __init__(self, config: dict[str, Any], cwd: Path, session_id: str, transcript_path: str = ""):
        for event in config:
            if event not in EVENTS:
                raise ValueError(f"unknown hook event {event!r}; known: {', '.join(EVENTS)}")
        self.config = config
        self.cwd = cwd
        self.session_id = session_id
        self.transcript_path = transcript_path

    def run(self, event: str, payload: dict[str, Any], tool_name: str | None = None) -> HookOutcome:
        out = HookOutcome()
        for entry in self.config.get(event, ()):
            matcher = entry.get("matcher") or ""
            if event in TOOL_EVENTS and matcher and not re.fullmatch(matcher, tool_name or ""):
                continue
            command = entry.get("command")
            if not command:
                out.warnings.append(f"{event} hook without a command: {entry}")
                continue
            data = {
                "hook_event_name": event,
                "session_id": self.session_id,
                "cwd": str(self.cwd),
                "transcript_path": self.transcript_path,
                **payload,
            }
            try:
                r = subprocess.run(
                    [host_path.which("bash") or "/bin/bash", "-c", command],
                    input=json.dumps(data, default=str),
                    capture_output=True,
                    text=True,
                    cwd=self.cwd,
                    timeout=float(entry.get("timeout", 60)),
                    # not the agent's environment (its API key): the allowlist, what the entry names, its `env`
                    env=scrubbed_env(
                        {str(k): str(v) for k, v in (entry.get("env") or {}).items()},
                        [str(n) for n in entry.get("pass_env") or ()],
                    ),  # fmt: skip
                )
            except subprocess.TimeoutExpired:
                out.warnings.append(f"{event} hook `{command}` timed out")
                continue
            if r.returncode == 2:
                out.blocked = True
                out.message += (r.stderr.strip() or f"blocked by {event} hook `{command}`") + "\n"
            elif r.returncode == 0:
                if r.stdout.strip() and event in ("SessionStart", "UserPromptSubmit"):
                    out.context += r.stdout.strip() + "\n"
            else:
                out.warnings.append(f"{event} hook `{command}` exited {r.returncode}: {r.stderr.strip()[:200]}")
        out.message = out.message.strip()
        out.context = out.context.strip()
        return out
