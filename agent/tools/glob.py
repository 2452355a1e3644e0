"""`glob(pattern, path?)`: files matching a glob pattern, newest first, without what git ignores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.tools.base import READ, ToolContext, ToolError, ToolResult, require
from agent.tools.ignore import SKIP_DIRS, git_ignored

MAX_RESULTS = 200


class GlobTool:
    name = "glob"
    kind = READ
    description = (
        "Find files by glob pattern (`**/*.py`, `src/**/test_*.py`). Returns paths relative to the search folder, "
        f"most recently modified first, at most {MAX_RESULTS}. Files ignored by git are left out."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Glob pattern; ** matches any folders."},
            "path": {"type": "string", "description": "Folder to search in (default: the working folder)."},
        },
        "required": ["pattern"],
    }

    def subject(self, args: dict[str, Any]) -> str | None:
        return args.get("path") or "."

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        pattern = require(args, "pattern")
        base = ctx.env.resolve(args.get("path") or ".")
        if not base.is_dir():
            raise ToolError(f"{ctx.env.display(base)} is not a folder")
        if pattern.startswith("/"):
            raise ToolError("pattern must be relative; put the folder in `path`")
        if ".." in Path(pattern).parts:
            raise ToolError("pattern must stay inside the folder (no `..`); put the folder in `path`")
        try:
            hits = [p for p in base.glob(pattern) if p.is_file()]
        except ValueError as e:
            raise ToolError(f"bad glob pattern: {e}") from None
        hits = [p for p in hits if not any(part in SKIP_DIRS for part in p.relative_to(base).parts)]
        hits = [p for p in hits if ctx.env.is_allowed(p)]  # real paths: a link out of the repository is left out
        ignored = git_ignored(ctx.env.root, hits)
        hits = [p for p in hits if p not in ignored]
        hits.sort(key=lambda p: (-p.stat().st_mtime_ns, str(p)))
        if not hits:
            return ToolResult(f"no files match {pattern!r} under {ctx.env.display(base)}")
        lines = [str(p.relative_to(base)) for p in hits[:MAX_RESULTS]]
        if len(hits) > MAX_RESULTS:
            lines.append(f"[{len(hits) - MAX_RESULTS} more; narrow the pattern]")
        return ToolResult("\n".join(lines))
