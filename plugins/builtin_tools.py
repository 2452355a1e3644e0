"""Built-in plugin: the agent's own tools (read, write, edit, glob, grep, bash, todo, terminal_*)."""

from __future__ import annotations

from agent.plugin_registry import hookimpl
from agent.tools import builtin_tools


@hookimpl
def register_tools(register, context) -> None:
    for tool in builtin_tools():
        register(tool)
