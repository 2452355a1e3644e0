"""`bash(command, timeout?, background?)`: run a shell command in the repository.

Each call is a fresh `bash -c` in the working folder (no state carries over: chain with `&&`). At the timeout the
whole process group is killed. `background` starts the command and returns at once with a log file to read
later. Long output is saved to a file and shown as head and tail.
"""

from __future__ import annotations

from typing import Any

from agent.tools.base import EXECUTE, ToolContext, ToolError, ToolResult, require


class BashTool:
    name = "bash"
    kind = EXECUTE
    description = (
        "Run a bash command in the working folder; stdout and stderr come back together with the exit code. "
        "Every call starts a new shell (cd and variables do not persist; chain with &&). timeout is in seconds "
        "(default 120, max 600). background=true starts a long-running command (a server, a watcher) and "
        "returns its log file path at once; read the log later with read or bash."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command line."},
            "timeout": {"type": "number", "description": "Seconds before the command is killed."},
            "background": {"type": "boolean", "description": "Start it and return at once."},
        },
        "required": ["command"],
    }

    def subject(self, args: dict[str, Any]) -> str | None:
        return args.get("command")

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        command = require(args, "command").strip()
        if not command:
            raise ToolError("command is empty")
        if args.get("background"):
            job = ctx.env.start_background(command)
            return ToolResult(
                f"started background job {job.id} (pid {job.proc.pid}); its output goes to {job.log_path}",
                data={"job": job.id, "log_path": str(job.log_path)},
            )
        timeout = args.get("timeout")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
            raise ToolError("timeout must be a positive number of seconds")
        res = ctx.env.execute(command, timeout)
        head = f"exit code {res.returncode}" if res.returncode is not None else "killed"
        body = res.output if res.output.strip() else "(no output)"
        return ToolResult(
            f"{body.rstrip()}\n[{head}]",
            is_error=res.returncode != 0,
            data={"returncode": res.returncode, "timed_out": res.timed_out, "full_output": res.full_output_path},
        )
