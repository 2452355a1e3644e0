"""Headless runs: `glm5 code -p "task"` for scripts and CI.

Output formats:
    text         the final answer on stdout; progress (tool calls, notices) on stderr
    json         one JSON object on stdout at the end: {"type": "result", "session_id", "exit_status",
                 "is_error", "result", "stats": {steps, prompt_tokens, completion_tokens, cost_usd}, "trajectory"}
    stream-json  one JSON event per line as things happen: init, message, tool_use, tool_result, notice,
                 then the result object above
Approvals: nobody is there to ask, so `--approval auto` answers yes and `--approval deny` (default) answers no.
Exit codes (EXIT_*): 0 done, 1 error (endpoint, crash), 2 bad input (arguments, settings, unknown session),
3 a limit was reached (--max-turns, tokens, cost, time, repeated malformed calls), 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from agent.client import APIError
from agent.loop import BLOCKED, ERROR, FORMAT, INTERRUPTED, LIMITS, SUBMITTED
from agent.ui import NO, YES, AgentUI, ApprovalRequest

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_LIMIT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
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
                    self.err.write(f"> {tc['function']['name']} {tc['function']['arguments'][:200]}\n")
        elif message.get("role") == "tool":
            self.emit({"type": "tool_result", "tool_call_id": message.get("tool_call_id"),
                       "content": message.get("content")})  # fmt: skip

    def on_notice(self, text: str) -> None:
        self.emit({"type": "notice", "text": text})
        if self.format != "stream-json":
            self.err.write(f"glm5: {text}\n")

    def approve(self, request: ApprovalRequest) -> str:
        answer = YES if self.approval == "auto" else NO
        if self.format == "text":
            verb = "approved" if answer == YES else "refused"
            self.err.write(f"glm5: {verb} {request.tool} ({request.reason}; --approval {self.approval})\n")
        return answer


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
        status, final = ERROR, f"model endpoint error: {e}"
        ui.on_notice(final)
    except KeyboardInterrupt:
        status, final = INTERRUPTED, "interrupted"
    except Exception as e:  # noqa: BLE001 - a crash still ends with a result object and the trajectory closed
        import traceback

        traceback.print_exc(file=ui.err)
        status, final = ERROR, f"internal error: {type(e).__name__}: {e}"
    finally:
        agent.finish(status, final)
        session.close()
    code = EXIT_CODES.get(status, EXIT_ERROR)
    summary = {"type": "result", "session_id": session.id, "exit_status": status, "is_error": code != EXIT_OK,
               "result": final, "stats": agent.stats.as_dict(), "trajectory": str(session.path)}  # fmt: skip
    if ui.format == "text":
        ui.out.write(final.rstrip() + "\n" if final else "")
        if code != EXIT_OK:
            ui.err.write(f"glm5: {status}\n")
    elif ui.format == "json":
        ui.out.write(json.dumps(summary, ensure_ascii=False, default=str) + "\n")
    else:
        ui.emit(summary)
    ui.out.flush()
    return code
