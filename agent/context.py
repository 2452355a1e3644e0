"""The model's context: the system prompt with the instruction files, and compaction.

Instruction files: AGENTS.md in each folder from the repository root down to the working folder (CLAUDE.md where
a folder has no AGENTS.md), plus the user's global `$GLM5_CONFIG_DIR/AGENTS.md`; each capped at 32 KiB.
Compaction replaces the conversation with [system prompt rebuilt, re-reading the instruction files from disk;
a user message holding the model's summary of the work so far; the last user request when it was not part of
the summary]. Re-reading the instruction files is the point: users' top complaint about compaction elsewhere is
that it loses them.
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path
from typing import Any

from agent.config_dir import config_dir
from agent.environment import shown_path
from agent.host_files import read_beneath
from agent.profiles import COMPACT_PROMPT

MAX_FILE_BYTES = 32 * 1024
NAMES = ("AGENTS.md", "CLAUDE.md")

SYSTEM_PROMPT = """\
You are glm5, a coding agent working in the user's repository through tools.
Working folder: {cwd} (repository root: {root}). Platform: {platform}. Date: {date}.

How to work:
- Explore before you change: glob, grep and read the relevant files. Read a file before you edit it.
- Make small, exact edits with `edit` (old_string must match exactly and be unique); `write` new files.
- Run commands with `bash` (each call is a fresh shell in the working folder; chain with &&). Run the tests
  that cover your change and fix what fails.
- For interactive programs (a REPL, a debugger, an editor, prompts that wait for an answer, a server whose log you
  watch) open a `terminal_open` session and drive it with `terminal_send` / `terminal_read`; close it when done.
- For multi-step work keep a `todo` list.
- Stay inside the repository. Do not commit, push or change git history unless asked.
- When the task is done, reply with a short summary of what you changed and how you checked it, without calling
  a tool: a reply without tool calls ends your turn.
{sandbox}"""

SUMMARY_PROMPT = """\
Summarize the conversation so far so that the work can continue from the summary alone. Include: the user's \
requests (verbatim where short), what was done and why, files read and changed (with paths), commands run and \
their results (tests passing or failing), decisions made, and exactly what remains to do next. Be concise but \
complete; do not call tools.{focus}"""


def instruction_files(root: Path, cwd: Path) -> list[Path]:
    root, cwd = root.resolve(), cwd.resolve()
    folders = [root]
    if cwd != root and root in cwd.parents:
        rel = cwd.relative_to(root)
        for i in range(1, len(rel.parts) + 1):
            folders.append(root.joinpath(*rel.parts[:i]))
    found = []
    glob = config_dir() / "AGENTS.md"
    if glob.is_file():
        found.append(glob)
    for d in folders:
        for name in NAMES:
            # a repository's link to a file outside it (`AGENTS.md -> ~/.aws/credentials`) would send that file
            # to the model: only files that really lie in the repository count
            if (d / name).is_file() and (d / name).resolve().is_relative_to(root):
                found.append(d / name)
                break
    return found


def _read_instruction(root: Path, f: Path) -> bytes | None:
    """A repository's instruction file read through the descriptor whose type was checked, walked from the root
    with no link followed: a command that swaps AGENTS.md for a link after instruction_files looked at it gets
    nothing read (the check and the read were two lookups before). The user's global file is read as it is."""
    root = root.resolve()
    try:
        rel = f.relative_to(root)
    except ValueError:
        return f.read_bytes()[: MAX_FILE_BYTES + 1] if f.is_file() else None
    return read_beneath(root, rel, MAX_FILE_BYTES + 1)


def instructions_text(root: Path, cwd: Path) -> str:
    parts = []
    for f in instruction_files(root, cwd):
        data = _read_instruction(root, f)
        if data is None:
            continue
        text = data[:MAX_FILE_BYTES].decode("utf-8", errors="replace")
        if len(data) > MAX_FILE_BYTES:
            text += f"\n[... cut at {MAX_FILE_BYTES} bytes]"
        parts.append(f'<instructions file="{f}">\n{text.strip()}\n</instructions>')
    return "\n\n".join(parts)


def system_prompt(root: Path, cwd: Path, sandbox_warning: str | None = None, extra: str = "",
                  profile: str = "full", shown_root: Path | None = None, date: str | None = None) -> str:  # fmt: skip
    """The system prompt of `profile` (agent/profiles.py), with instruction files and hook context appended.
    `shown_root`: the path the model is shown for `root` (Environment.shown_root), in place of the host's;
    `date`: the date it is given (Environment.shown_date; None: today)."""
    shown_cwd = shown_path(cwd, root, shown_root)
    if profile == "compact":
        prompt = COMPACT_PROMPT.format(cwd=shown_cwd) + (f"Note: {sandbox_warning}\n" if sandbox_warning else "")
        return _with_context(prompt, root, cwd, extra)
    prompt = SYSTEM_PROMPT.format(
        cwd=shown_cwd,
        root=shown_root if shown_root is not None else root,
        platform=platform.system(),
        date=date or datetime.date.today().isoformat(),
        sandbox=f"Note: {sandbox_warning}\n"
        if sandbox_warning
        else "Commands run in a sandbox: the repository is "
        "writable, the rest of the filesystem read-only, and the network may be off.\n",
    )
    return _with_context(prompt, root, cwd, extra)


def _with_context(prompt: str, root: Path, cwd: Path, extra: str) -> str:
    inst = instructions_text(root, cwd)
    if inst:
        prompt += "\nProject instructions (follow them):\n\n" + inst + "\n"
    if extra:
        prompt += "\n" + extra + "\n"
    return prompt


MAX_TOOL_CHARS_IN_SUMMARY = 4000


def _shorten(m: dict[str, Any]) -> dict[str, Any]:
    c = m.get("content")
    if m.get("role") == "tool" and isinstance(c, str) and len(c) > MAX_TOOL_CHARS_IN_SUMMARY:
        half = MAX_TOOL_CHARS_IN_SUMMARY // 2
        return {**m, "content": f"{c[:half]}\n[... {len(c) - 2 * half} characters cut ...]\n{c[-half:]}"}
    return m


def summary_request(messages: list[dict[str, Any]], focus: str | None) -> list[dict[str, Any]]:
    """The messages sent to get a summary: the conversation with long tool outputs cut, and the instruction."""
    f = f"\nFocus especially on: {focus}" if focus else ""
    return [*(_shorten(m) for m in messages), {"role": "user", "content": SUMMARY_PROMPT.format(focus=f)}]


def drop_oldest_half(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newer half of a conversation (no system message), starting at a user message so that no tool result
    is left without the assistant call it answers."""
    rest = messages[len(messages) // 2 :]
    for i, m in enumerate(rest):
        if m.get("role") == "user":
            return rest[i:]
    return rest[-1:]


def compacted(system: str, summary: str, last_user: str | None) -> list[dict[str, Any]]:
    msgs = [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": "This conversation was compacted to fit the context window. Summary of the work so far:\n\n"
            + summary.strip(),
        },
        {"role": "assistant", "content": "Understood. I will continue from the summary."},
    ]
    if last_user:
        msgs.append({"role": "user", "content": f"(The latest request, repeated.) {last_user}"})
    return msgs
