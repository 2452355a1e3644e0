"""`todo(items)`: the model's task list for the current work, replaced whole on every call."""

from __future__ import annotations

from typing import Any

from agent.tools.base import OTHER, ToolContext, ToolError, ToolResult, require

STATUSES = ("pending", "in_progress", "completed")
MARKS = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}


class TodoTool:
    name = "todo"
    kind = OTHER
    description = (
        "Keep a task list for multi-step work. Send the whole list each time; each item has content and "
        "status (pending, in_progress, completed). Keep one item in_progress at a time."
    )
    parameters = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string"},
                        "status": {"type": "string", "enum": list(STATUSES)},
                    },
                    "required": ["content", "status"],
                },
            }
        },
        "required": ["items"],
    }

    def subject(self, args: dict[str, Any]) -> str | None:
        return None

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        items = require(args, "items", list)
        clean = []
        for i, it in enumerate(items):
            if not isinstance(it, dict) or not isinstance(it.get("content"), str):
                raise ToolError(f"item {i} needs a string `content`")
            status = it.get("status", "pending")
            if status not in STATUSES:
                raise ToolError(f"item {i}: status must be one of {', '.join(STATUSES)}")
            clean.append({"content": it["content"], "status": status})
        ctx.state.todos = clean
        lines = [f"{MARKS[it['status']]} {it['content']}" for it in clean] or ["(empty list)"]
        return ToolResult("\n".join(lines), data={"todos": clean})
