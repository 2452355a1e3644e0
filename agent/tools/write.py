"""`write(path, content)`: create or overwrite a file. An existing file must have been read first."""

from __future__ import annotations

import difflib
from typing import Any

from agent.tools import fence
from agent.tools.base import EDIT, ToolContext, ToolError, ToolResult, require


def unified_diff(before: str, after: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
        )
    )


def check_fresh(path, ctx: ToolContext) -> None:
    """Refuse to change a file the model has not seen, or that changed on disk since it was read."""
    seen = ctx.state.read_files.get(str(path))
    if seen is None:
        raise ToolError(f"read {ctx.env.display(path)} before changing it")
    if path.stat().st_mtime_ns != seen:
        raise ToolError(f"{ctx.env.display(path)} changed on disk since it was read; read it again")


def refuses_unread(args: dict[str, Any], ctx: ToolContext) -> None:
    """check_fresh on the call's path, where it names an existing file."""
    if isinstance(args.get("path"), str):
        path = ctx.env.resolve(args["path"])
        if path.is_file():
            check_fresh(path, ctx)


class WriteTool:
    name = "write"
    kind = EDIT
    description = (
        "Write a file with the given content, creating parent folders. Overwriting an existing file needs a "
        "read of it first; prefer edit for changes to existing files."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, absolute or relative to the working folder."},
            "content": {"type": "string", "description": "The whole new content of the file."},
        },
        "required": ["path", "content"],
    }

    def subject(self, args: dict[str, Any]) -> str | None:
        return args.get("path")

    def refuses(self, args: dict[str, Any], ctx: ToolContext) -> None:
        """Before any approval prompt: an existing file not read (or changed since) is refused (ToolError)."""
        refuses_unread(args, ctx)

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = ctx.env.resolve(require(args, "path"))
        content = require(args, "content")
        before = ""
        if path.exists():
            if path.is_dir():
                raise ToolError(f"{ctx.env.display(path)} is a directory")
            check_fresh(path, ctx)
            before = fence.read_bytes(ctx.env, path).decode("utf-8", errors="replace")
        fence.write_bytes(ctx.env, path, content.encode("utf-8"))
        ctx.state.read_files[str(path)] = path.stat().st_mtime_ns
        name = ctx.env.display(path)
        verb = "updated" if before else "created"
        n = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        return ToolResult(
            f"{verb} {name} ({n} lines)", data={"path": str(path), "diff": unified_diff(before, content, name)}
        )
