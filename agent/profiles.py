"""Agent profiles: which tools the model is offered and which system prompt it gets.

    full     every registered tool (built-ins, MCP, plugins) and context.SYSTEM_PROMPT: the default
    compact  read, edit, bash and glob with one-sentence schemas (required arguments only), and a four-line
             prompt: for a small model served on little compute; with `terminal`, also terminal_open / _send /
             _read / _close

Why `compact` exists: the full prefix (prompt + seven tool schemas) is 1,681 tokens, while a small model writes
~150 tokens in a typical repair session; every turn re-reads the prefix, and training on recorded sessions pays
for it on every step. The compact prefix is 560 tokens (a proof repair session 954 instead of 2,075), and a model trained on compact sessions must
be served with the same profile (what was trained is what is measured). Set with `[agent] profile = "compact"`,
`GLM5_AGENT_PROFILE`, `glm5 code --profile` or `glm5 bench swe --agent-profile`. Instruction files (AGENTS.md)
and hook context are still appended to the compact prompt.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

PROFILES = ("full", "compact")
COMPACT_TOOLS = ("read", "edit", "bash", "glob")
# The terminal tools (agent/tools/terminal.py): in full by default; in compact when asked for (`[agent] terminal =
# true`, and `glm5 bench terminal` asks), so that a compact session without terminals keeps its 560-token prefix
# (the models trained on it are served with it). Compact offers four of the five, without resize.
TERMINAL_TOOLS = ("terminal_open", "terminal_send", "terminal_read", "terminal_resize", "terminal_close")
COMPACT_TERMINAL_TOOLS = ("terminal_open", "terminal_send", "terminal_read", "terminal_close")

COMPACT_PROMPT = """\
You are glm5, a coding agent. Working folder: {cwd}.
Read a file before you edit it; `edit` replaces an exact, unique old_string. `bash` runs a command.
Run the tests that cover your change.
When done, reply with one sentence and no tool call.
"""


def check_profile(name: str) -> str:
    if name not in PROFILES:
        raise ValueError(f"agent profile {name!r} is not one of {', '.join(PROFILES)}")
    return name


def tool_names(profile: str, registered: list[str], terminal: bool | None = None) -> list[str]:
    """The registered tools a profile offers, in registration order. `terminal`: with the terminal tools (None:
    the profile's default, yes in full, no in compact)."""
    if check_profile(profile) == "full":
        return [n for n in registered if terminal is not False or n not in TERMINAL_TOOLS]
    extra = COMPACT_TERMINAL_TOOLS if terminal else ()
    return [n for n in registered if n in COMPACT_TOOLS or n in extra]


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's schema as the compact profile offers it: the description's first sentence, the required
    arguments only, without their descriptions. The tool still accepts its optional arguments."""
    fn = schema["function"]
    params = fn.get("parameters") or {}
    required = list(params.get("required") or [])
    props = {k: {kk: vv for kk, vv in v.items() if kk != "description"}
             for k, v in (params.get("properties") or {}).items() if k in required}  # fmt: skip
    first = re.split(r"(?<=[.!?])\s", fn.get("description", ""), maxsplit=1)[0]
    return {**schema, "function": {"name": fn["name"], "description": first,
                                   "parameters": {"type": "object", "properties": props, "required": required}}}  # fmt: skip


def schema_rewrite(profile: str) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    return compact_schema if check_profile(profile) == "compact" else None
