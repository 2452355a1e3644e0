"""`grep(pattern, path?, glob?)`: regex search over file contents, ripgrep when installed.

The Python path is the reference the ripgrep fast path is tested against (same output format: `path:line:text`,
paths relative to the search folder, sorted). Both skip what git ignores.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path
from typing import Any

from agent import host_path
from agent.tools.base import READ, ToolContext, ToolError, ToolResult, require
from agent.tools.ignore import walk_files

MAX_MATCHES = 300
MAX_LINE_CHARS = 500


def grep_python(pattern: str, base: Path, root: Path, glob: str | None) -> list[str]:
    rx = re.compile(pattern)
    out = []
    for f in sorted(walk_files(base, root)):
        rel = str(f.relative_to(base)) if f != base else f.name
        if glob and not (fnmatch.fnmatch(rel, glob) or fnmatch.fnmatch(f.name, glob)):
            continue
        try:
            data = f.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if rx.search(line):
                out.append(f"{rel}:{i}:{line}")
    return out


def grep_rg(pattern: str, base: Path, glob: str | None) -> list[str]:
    exe = host_path.which("rg")  # never one a command put in the repository (an active .venv/bin on PATH)
    if exe is None:
        raise ToolError("ripgrep (rg) is not installed")
    argv = [exe, "--line-number", "--no-heading", "--color", "never", "--with-filename", "--hidden"]
    argv += ["--glob", "!.git", "--glob", "!.glm5", "--sort", "path"]
    if glob:
        argv += ["--glob", glob]
    argv += ["-e", pattern, "--", "."]
    r = subprocess.run(argv, cwd=base if base.is_dir() else base.parent, capture_output=True, text=True, timeout=60)
    if r.returncode == 2:
        raise ToolError(f"ripgrep: {r.stderr.strip()[:300]}")
    lines = [ln[2:] if ln.startswith("./") else ln for ln in r.stdout.splitlines()]
    if base.is_file():
        lines = [ln for ln in lines if ln.startswith(base.name + ":")]
    return lines


class GrepTool:
    name = "grep"
    kind = READ
    description = (
        "Search file contents with a regular expression (ripgrep syntax). Returns `path:line:text` lines. "
        "Optional glob filters file names (`*.py`). Files ignored by git are skipped."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression."},
            "path": {"type": "string", "description": "File or folder to search (default: the working folder)."},
            "glob": {"type": "string", "description": "Only files whose name matches this glob."},
        },
        "required": ["pattern"],
    }

    def __init__(self, use_ripgrep: bool | None = None):
        self.use_ripgrep = host_path.which("rg") is not None if use_ripgrep is None else use_ripgrep

    def subject(self, args: dict[str, Any]) -> str | None:
        return args.get("path") or "."

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        pattern = require(args, "pattern")
        base = ctx.env.resolve(args.get("path") or ".")
        if not base.exists():
            raise ToolError(f"{ctx.env.display(base)} does not exist")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ToolError(f"bad regular expression: {e}") from None
        glob = args.get("glob")
        lines = grep_rg(pattern, base, glob) if self.use_ripgrep else grep_python(pattern, base, ctx.env.root, glob)
        if not lines:
            return ToolResult(f"no matches for {pattern!r}")
        shown = [ln if len(ln) <= MAX_LINE_CHARS else ln[:MAX_LINE_CHARS] + " [cut]" for ln in lines[:MAX_MATCHES]]
        if len(lines) > MAX_MATCHES:
            shown.append(f"[{len(lines) - MAX_MATCHES} more matches; narrow the pattern, path or glob]")
        return ToolResult("\n".join(shown))
