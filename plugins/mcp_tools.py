"""Built-in plugin: the tools of the MCP servers named in settings (`[mcp_servers.*]`)."""

from __future__ import annotations

from agent.plugin_registry import hookimpl


@hookimpl
def register_tools(register, context) -> None:
    servers = getattr(context.settings, "mcp_servers", None) or {}
    if not servers:
        return
    # the mcp library (about 35 ms to import) only where settings name an MCP server: every session loads this plugin
    from agent.mcp import MCPConnection, MCPError, MCPTool

    cwd = str(context.env.root) if context.env is not None else None
    for name, spec in servers.items():
        try:
            conn = MCPConnection(name, spec, cwd=cwd)
        except MCPError as e:
            context.warnings.append(str(e))
            continue
        context.closers.append(conn.close)
        for tool in conn.tools:
            register(MCPTool(conn, tool))
