"""MCP client: tools of MCP servers named in settings, over stdio or streamable HTTP (the official `mcp` SDK).

    [mcp_servers.files]            # stdio: the server is a subprocess
    command = "python"
    args = ["server.py"]
    env = { "ROOT" = "." }           # added to the scrubbed environment (agent/child_env.py)
    pass_env = ["GITHUB_TOKEN"]      # host variables the server may see (it gets no others that look secret)
    [mcp_servers.search]           # streamable HTTP
    url = "http://127.0.0.1:9000/mcp"

Each server gets one long-lived connection run by an asyncio loop on a daemon thread; the agent's synchronous
loop calls into it. Tools are exposed as `mcp__<server>__<tool>` and register through the plugin hook like the
built-ins (plugins/mcp_tools.py). Permissions treat them as commands (they can do anything).
"""

from __future__ import annotations

import asyncio
import re
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from agent.child_env import scrubbed_env
from agent.tools.base import EXECUTE, ToolContext, ToolError, ToolResult


class MCPError(RuntimeError):
    pass


class MCPConnection:
    """One MCP server, connected for the session's life."""

    def __init__(self, name: str, spec: dict[str, Any], cwd: str | None = None, timeout_s: float = 60.0):
        self.name = name
        self.spec = spec
        self.cwd = cwd
        self.timeout_s = float(spec.get("timeout", timeout_s))
        self.tools: list[Any] = []
        self._client: Any = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{name}", daemon=True)
        self._thread.start()
        self._main_future = asyncio.run_coroutine_threadsafe(self._main(), self._loop)
        if not self._ready.wait(self.timeout_s):
            self.close()
            raise MCPError(f"MCP server {name!r} did not start within {self.timeout_s:g}s")
        if self._error is not None:
            self.close()
            raise MCPError(f"MCP server {name!r} failed to start: {self._error}")

    def _target(self) -> Any:
        from mcp import StdioServerParameters  # the SDK costs ~1.8 s to import: only where a server is configured

        if self.spec.get("url"):
            return str(self.spec["url"])
        if not self.spec.get("command"):
            raise MCPError(f"[mcp_servers.{self.name}] needs `command` (stdio) or `url` (streamable HTTP)")
        return StdioServerParameters(
            command=str(self.spec["command"]),
            args=[str(a) for a in self.spec.get("args", [])],
            # not the agent's whole environment (its API key): the allowlist, what `pass_env` names, and `env`
            env=scrubbed_env(
                {k: str(v) for k, v in (self.spec.get("env") or {}).items()},
                [str(n) for n in self.spec.get("pass_env") or ()],
            ),
            cwd=self.cwd,
        )

    async def _main(self) -> None:
        from mcp import Client  # ~1.8 s to import: only where a server is configured

        self._stop = asyncio.Event()
        try:
            async with Client(self._target()) as client:
                self._client = client
                self.tools = list((await client.list_tools()).tools)
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported to the waiting caller
            self._error = e
            self._ready.set()

    def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        if self._client is None:
            raise MCPError(f"MCP server {self.name!r} is not connected")
        fut = asyncio.run_coroutine_threadsafe(self._client.call_tool(tool, arguments), self._loop)
        try:
            return fut.result(self.timeout_s)
        except FutureTimeout:
            fut.cancel()
            raise MCPError(f"{self.name}/{tool} did not answer within {self.timeout_s:g}s") from None

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            try:
                self._main_future.result(10)
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


class MCPTool:
    """An MCP server's tool, seen by the agent as any other tool."""

    kind = EXECUTE

    def __init__(self, conn: MCPConnection, tool: Any):
        self.conn = conn
        self.remote_name = tool.name
        self.name = f"mcp__{_safe(conn.name)}__{_safe(tool.name)}"
        self.description = (tool.description or f"{tool.name} from MCP server {conn.name}")[:2000]
        schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}
        self.parameters = dict(schema) if schema else {"type": "object", "properties": {}}

    def subject(self, args: dict[str, Any]) -> str | None:
        return None

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            res = self.conn.call(self.remote_name, args)
        except MCPError as e:
            raise ToolError(str(e)) from None
        parts = []
        for block in getattr(res, "content", None) or []:
            text = getattr(block, "text", None)
            parts.append(text if text is not None else f"[{getattr(block, 'type', 'content')} block]")
        structured = getattr(res, "structured_content", None)
        if not parts and structured is not None:
            parts.append(str(structured))
        is_error = bool(getattr(res, "is_error", False))
        return ToolResult("\n".join(parts) or "(no output)", is_error=is_error, data={"mcp_server": self.conn.name})
