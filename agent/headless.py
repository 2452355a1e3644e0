"""Headless runs: `glm5 code -p "task"` for scripts and CI.

Output formats:
    text         the final answer on stdout; progress (tool calls, refusals, notices) on stderr
    json         one JSON object on stdout at the end: {"type": "result", "session_id", "exit_status",
                 "is_error", "result", "denied": [{"tool_call_id", "tool", "arguments", "decision", "reason"}],
                 "stats": {steps, prompt_tokens, completion_tokens, cost_usd}, "trajectory"}
    stream-json  one JSON event per line as things happen: init, message, tool_use, tool_result (with
                 `decision`: allow | approved | denied | blocked | format_error, and `reason` when refused),
                 notice, then the result object above
Approvals: nobody is there to ask, so `--approval auto` answers yes and `--approval deny` (default) answers no.
Every refused call (by --approval deny, a deny rule, plan mode or a PreToolUse hook) is listed in `denied` and
said on stderr as `glm5: refused TOOL ARGS: REASON`, in every format. A malformed call (an unknown tool, arguments
that do not parse, a required one missing) is the model's mistake, not a refusal: said on stderr as `glm5:
malformed TOOL call, not run: WHY`, not listed in `denied`.
Exit codes (EXIT_*): 0 done, 1 error (endpoint, crash), 2 bad input (arguments, settings, unknown session),
3 a limit was reached (--max-turns, tokens, cost, time, repeated malformed calls), 4 done but some tool calls
were refused (the answer may rest on work not done; `is_error` is true), 130 interrupted.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import traceback
from typing import Any, TextIO

from agent import commands
from agent.client import APIError
from agent.loop import BLOCKED, ERROR, FORMAT, INTERRUPTED, LIMITS, SUBMITTED
from agent.ui import NO, YES, AgentUI, Answer, ApprovalRequest, terminal_safe

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_LIMIT, EXIT_DENIED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
REFUSED = ("denied", "blocked")
FORMATS = ("text", "json", "stream-json")
EXIT_CODES = {SUBMITTED: EXIT_OK, LIMITS: EXIT_LIMIT, FORMAT: EXIT_LIMIT, INTERRUPTED: EXIT_INTERRUPTED,
              ERROR: EXIT_ERROR, BLOCKED: EXIT_ERROR}  # fmt: skip


class HeadlessUI(AgentUI):
    def __init__(self, output_format: str = "text", approval: str = "deny", out: TextIO | None = None,
                 err: TextIO | None = None):  # fmt: skip
        self.format = output_format
        self.approval = approval
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.decisions: dict[str, tuple[str, str]] = {}  # call id -> (decision, reason)
        self.denied: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        if self.format == "stream-json":
            self.out.write(json.dumps(event, ensure_ascii=False, default=str) + "\n")
            self.out.flush()

    def on_message(self, message: dict[str, Any]) -> None:
        if message.get("role") == "assistant":
            ev = {"type": "message", "role": "assistant", "content": message.get("content")}
            if message.get("reasoning_content"):
                ev["reasoning_content"] = message["reasoning_content"]
            self.emit(ev)
            for tc in message.get("tool_calls") or []:
                self.emit({"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                           "arguments": tc["function"]["arguments"]})  # fmt: skip
                if self.format == "text":
                    self.err.write(f"> {_line(tc['function']['name'])} {_line(tc['function']['arguments'])[:200]}\n")
        elif message.get("role") == "tool":
            ev = {"type": "tool_result", "tool_call_id": message.get("tool_call_id"), "content": message.get("content")}
            decision, reason = self.decisions.get(message.get("tool_call_id") or "", ("", ""))
            if decision:  # none for calls an interrupt stopped before they were decided
                ev["decision"] = decision
                if decision in REFUSED:
                    ev["reason"] = reason
            self.emit(ev)

    def on_tool_decision(self, call_id: str, name: str, arguments: Any, decision: str, reason: str) -> None:
        self.decisions[call_id] = (decision, reason)
        if decision in REFUSED:
            self.denied.append({"tool_call_id": call_id, "tool": name, "arguments": arguments, "decision": decision,
                                "reason": reason})  # fmt: skip
            shown = arguments.get("command", arguments.get("path")) if isinstance(arguments, dict) else None
            shown = str(shown if shown is not None else json.dumps(arguments, default=str))[:200]
            self.err.write(f"glm5: refused {_line(name)} {_line(shown)}: {_line(reason)}\n")
            self.err.flush()
        elif decision == "format_error":  # the model's mistake, said like a refusal but not one (exit code, `denied`)
            self.err.write(f"glm5: malformed {_line(name) or 'tool'} call, not run: {_line(reason)}\n")
            self.err.flush()

    def on_notice(self, text: str) -> None:
        self.emit({"type": "notice", "text": text})
        if self.format != "stream-json":
            self.err.write(f"glm5: {terminal_safe(text)}\n")

    def approve(self, request: ApprovalRequest) -> str:
        if self.approval == "auto":
            if self.format == "text":
                self.err.write(f"glm5: approved {request.tool} ({request.reason}; --approval auto)\n")
            return YES
        return Answer(NO, reason=f"{request.reason}; refused by --approval deny (headless: nobody to ask)")


def _line(text: Any) -> str:
    """What the model wrote, for one progress line on stderr (escape codes escaped)."""
    return terminal_safe(text, lines=False)


def run_headless(session: Any, prompt: str, ui: HeadlessUI) -> int:
    agent = session.agent
    ui.emit({"type": "init", "session_id": session.id, "model": session.settings.provider.model,
             "tools": agent.tools.names(), "trajectory": str(session.path), "resumed": session.resumed})  # fmt: skip
    for w in session.warnings:
        ui.on_notice(w)
    status, final = ERROR, ""
    try:
        result = agent.run(prompt)
        status, final = result.exit_status, result.final
    except APIError as e:
        status, final = ERROR, f"model endpoint error: {e}" + _key_hint(e, session)
        if ui.format != "text":  # text: the result line below says it, once
            ui.on_notice(final)
    except KeyboardInterrupt:
        status, final = INTERRUPTED, "interrupted"
    except Exception as e:  # noqa: BLE001 - a crash still ends with a result object and the trajectory closed
        traceback.print_exc(file=ui.err)
        status, final = ERROR, f"internal error: {type(e).__name__}: {e}"
    finally:
        agent.finish(status, final)
        session.close()
    code = EXIT_CODES.get(status, EXIT_ERROR)
    if status == SUBMITTED and not final.strip():  # a reply of reasoning only (or nothing): no answer to print
        ui.on_notice("the model ended without an answer: its last reply held no text (reasoning only, or empty)")
    if code == EXIT_OK and ui.denied:
        code = EXIT_DENIED
    summary = {"type": "result", "session_id": session.id, "exit_status": status, "is_error": code != EXIT_OK,
               "result": final, "denied": ui.denied, "stats": agent.stats.as_dict(),
               "trajectory": str(session.path)}  # fmt: skip
    if ui.format == "text":
        ui.out.write(final.rstrip() + "\n" if final else "")
    if code == EXIT_DENIED:
        ui.err.write(f"glm5: {status}, but {len(ui.denied)} tool call(s) were refused (exit {EXIT_DENIED})\n")
    elif code != EXIT_OK and ui.format == "text":
        ui.err.write(f"glm5: {status}\n")
    if ui.format == "json":
        ui.out.write(json.dumps(summary, ensure_ascii=False, default=str) + "\n")
    elif ui.format == "stream-json":
        ui.emit(summary)
    ui.out.flush()
    return code


def _key_hint(e: APIError, session: Any) -> str:
    """For a 401 / 403: which variable the key was read from, and whether it was set at all."""
    if e.status not in (401, 403):
        return ""
    var = getattr(session.settings.provider, "api_key_env", None)
    if not var:
        return " (the endpoint wants an API key: name the variable that holds it with --api-key-env)"
    state = "is not set" if not os.environ.get(var) else "holds a key the endpoint refused"
    return f" ({var} {state}: export the key there, or name another variable with --api-key-env)"


class NoModel:
    """The model of a session opened only to undo, rewind or diff it: these never call it."""

    def __init__(self) -> None:
        self.cancel_event = threading.Event()

    def query(self, *a: Any, **k: Any) -> Any:
        raise APIError("this session was opened without a model endpoint")


def is_session_command(text: str) -> bool:
    """`/undo`, `/rewind [N]` or `/diff`: what `-p` runs as a command on the latest session, not as a task."""
    return re.fullmatch(r"\s*/(undo|diff|rewind(\s+\d+)?)\s*", text) is not None


def run_session_command(session: Any, line: str, output_format: str = "text", out: TextIO | None = None,
                        err: TextIO | None = None) -> int:  # fmt: skip
    """`glm5 code --undo / --rewind N / --diff`: one slash command on a recorded session, without the model.
    Exit 0 done, 2 when it cannot be done (nothing to undo, N out of range, not a git repository)."""
    out, err = out or sys.stdout, err or sys.stderr
    agent = session.agent
    try:
        res = commands.handle(session, line)
        name, _, arg = line.partition(" ")
        if not res.error and (name == "/undo" or (name == "/rewind" and arg.strip())):
            agent.writer.write("outcome", labels=agent.labels())  # files_changed / diff_kept after the undo
    finally:
        agent.env.close()
        session.close()
    code = EXIT_BAD_INPUT if res.error else EXIT_OK
    res.text = res.text.replace("/rewind N", "glm5 code --rewind N")  # the command line's words, not the TUI's
    if output_format == "text":
        (err if res.error else out).write(res.text.rstrip("\n") + "\n")
    else:
        event = {"type": "result", "command": line, "session_id": session.id, "is_error": res.error,
                 "result": res.text, "trajectory": str(session.path)}  # fmt: skip
        out.write(json.dumps(event, ensure_ascii=False) + "\n")
    out.flush()
    return code
