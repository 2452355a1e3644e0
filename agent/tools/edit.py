"""`edit(path, old_string, new_string, replace_all?)`: exact string replacement in a file read before.

No fuzzy matching: `old_string` must occur exactly, and once unless `replace_all`. Failing loudly teaches the
model to quote enough context, which is what makes edits reliable.
"""

from __future__ import annotations

from typing import Any

from agent.tools import fence
from agent.tools.base import EDIT, ToolContext, ToolError, ToolResult, require
from agent.tools.write import check_fresh, refuses_unread, unified_diff


class EditTool:
    name = "edit"
    kind = EDIT
    description = (
        "Replace old_string with new_string in a file. old_string must match the file exactly (whitespace "
        "included) and be unique, unless replace_all is true. The file must have been read first."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, absolute or relative to the working folder."},
            "old_string": {"type": "string", "description": "Exact text to replace."},
            "new_string": {"type": "string", "description": "Replacement text."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
        },
        "required": ["path", "old_string", "new_string"],
    }

    def subject(self, args: dict[str, Any]) -> str | None:
        return args.get("path")

    def refuses(self, args: dict[str, Any], ctx: ToolContext) -> None:
        """Before any approval prompt: a file that does not exist, or that the model has not read (ToolError)."""
        if isinstance(args.get("path"), str) and not ctx.env.resolve(args["path"]).is_file():
            raise ToolError(f"{ctx.env.display(ctx.env.resolve(args['path']))} does not exist; use write to create it")
        refuses_unread(args, ctx)

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = ctx.env.resolve(require(args, "path"))
        old = require(args, "old_string")
        new = require(args, "new_string")
        replace_all = bool(args.get("replace_all", False))
        name = ctx.env.display(path)
        if not path.is_file():
            raise ToolError(f"{name} does not exist; use write to create it")
        check_fresh(path, ctx)
        if old == "":
            raise ToolError("old_string is empty; use write to create or overwrite a file")
        if old == new:
            raise ToolError("old_string and new_string are the same; nothing to change")
        before = fence.read_bytes(ctx.env, path).decode("utf-8")
        count = before.count(old)
        if count == 0:
            raise ToolError(f"old_string was not found in {name}; read the file and quote it exactly")
        if count > 1 and not replace_all:
            raise ToolError(
                f"old_string occurs {count} times in {name}; add surrounding lines to make it unique, "
                "or set replace_all"
            )
        after = before.replace(old, new) if replace_all else before.replace(old, new, 1)
        fence.write_bytes(ctx.env, path, after.encode("utf-8"))  # bytes: keep CRLF as it was
        ctx.state.read_files[str(path)] = path.stat().st_mtime_ns
        n = count if replace_all else 1
        return ToolResult(
            f"edited {name}: {n} replacement{'s' if n > 1 else ''}",
            data={"path": str(path), "diff": unified_diff(before, after, name)},
        )
