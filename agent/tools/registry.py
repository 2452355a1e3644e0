"""The tool registry: name -> tool, and the OpenAI `tools` list offered to the model.

Filled by plugins (`agent.plugin_registry`): the built-in tools and MCP tools register through the same hook a
third-party plugin uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.tools.base import Tool, schema


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._shorten: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def register(self, tool: Tool) -> None:
        if not tool.name or not tool.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"bad tool name {tool.name!r}: use letters, digits, _ and -")
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        out = [schema(t) for t in self._tools.values()]
        return [self._shorten(s) for s in out] if self._shorten else out

    def restrict(self, names: list[str], shorten: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        """Keep only `names` (an agent profile's subset, agent/profiles.py); the others are not offered.
        `shorten` rewrites each schema offered to the model (the tools themselves still take every argument)."""
        self._tools = {n: t for n, t in self._tools.items() if n in names}
        self._shorten = shorten

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)
