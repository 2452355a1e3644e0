"""`read(path, offset?, limit?)`: a file's lines, numbered like `cat -n`, and remembered for `edit`."""

from __future__ import annotations

from typing import Any

from agent.tools import fence
from agent.tools.base import READ, ToolContext, ToolError, ToolResult, require

MAX_LINES = 2000
MAX_LINE_CHARS = 2000


class ReadTool:
    name = "read"
    kind = READ
    description = (
        "Read a text file. Returns lines numbered from 1 (like `cat -n`). Use offset (1-based first line) and "
        f"limit for long files; at most {MAX_LINES} lines are returned per call. A file must be read before "
        "it can be edited."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, absolute or relative to the working folder."},
            "offset": {"type": "integer", "description": "First line to return, 1-based."},
            "limit": {"type": "integer", "description": "How many lines to return."},
        },
        "required": ["path"],
    }

    def subject(self, args: dict[str, Any]) -> str | None:
        return args.get("path")

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = ctx.env.resolve(require(args, "path"))
        offset = int(args.get("offset") or 1)
        limit = int(args.get("limit") or MAX_LINES)
        if offset < 1 or limit < 1:
            raise ToolError("offset and limit must be positive")
        if path.is_dir():
            raise ToolError(f"{ctx.env.display(path)} is a directory; use glob to list files")
        if not path.is_file():
            raise ToolError(f"{ctx.env.display(path)} does not exist")
        raw = fence.read_bytes(ctx.env, path)
        if b"\0" in raw[:8192]:
            raise ToolError(f"{ctx.env.display(path)} is a binary file ({len(raw)} bytes)")
        text = raw.decode("utf-8", errors="replace")
        ctx.state.read_files[str(path)] = path.stat().st_mtime_ns
        lines = text.splitlines()
        chunk = lines[offset - 1 : offset - 1 + min(limit, MAX_LINES)]
        out = []
        for i, line in enumerate(chunk, start=offset):
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS] + " [line cut]"
            out.append(f"{i:6d}\t{line}")
        if not lines:
            return ToolResult("(empty file)")
        end = offset - 1 + len(chunk)
        if end < len(lines):
            out.append(f"[lines {offset}-{end} of {len(lines)}; read on with offset={end + 1}]")
        return ToolResult("\n".join(out), data={"path": str(path)})
