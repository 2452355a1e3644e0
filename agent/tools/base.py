"""What every tool is: a name, a JSON schema, a kind (for permissions) and `run(args, ctx) -> ToolResult`.

Tool names and argument names are part of the trajectory format (they become training data), so they are
stable: change a schema only by adding optional arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.environment import Environment

# What a tool does, as permissions see it.
READ, EDIT, EXECUTE, OTHER = "read", "edit", "execute", "other"


class ToolError(Exception):
    """The call was understood but cannot be done; the message goes back to the model as an error result."""


@dataclass
class ToolResult:
    output: str
    is_error: bool = False
    data: dict[str, Any] = field(default_factory=dict)  # structured extras: returncode, diff, paths


@dataclass
class ToolState:
    """Per-session memory the tools share: which files were read (and at what mtime), the todo list."""

    read_files: dict[str, int] = field(default_factory=dict)  # absolute path -> mtime_ns when last read
    todos: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ToolContext:
    env: Environment
    state: ToolState


class Tool(Protocol):
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments
    kind: str  # READ | EDIT | EXECUTE | OTHER

    def subject(self, args: dict[str, Any]) -> str | None:
        """What permission rules match against: the path for file tools, the command for bash."""
        ...

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


def schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI `tools` entry for a tool."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def missing_argument(key: str) -> str:
    """What the model is told of a call without `key` (the agent loop's check before approval, and the tool's)."""
    return f"missing required argument `{key}`"


def require(args: dict[str, Any], key: str, typ: type | tuple[type, ...] = str) -> Any:
    if key not in args:
        raise ToolError(missing_argument(key))
    v = args[key]
    if not isinstance(v, typ):
        raise ToolError(f"argument `{key}` must be {getattr(typ, '__name__', typ)}, got {type(v).__name__}")
    return v
