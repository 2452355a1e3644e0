"""The built-in plugins: they use glm5's extension points exactly as a third-party plugin would.

    builtin_tools.py    the agent's built-in tools
    mcp_tools.py        tools of the MCP servers named in settings
    builtin_rewards.py  RL rewards for `glm5 finetune rl`: regex, sandboxed command
    builtin_bench.py    the built-in benchmark suites (swe:builtin, terminal:builtin) from bench_suites/

The hook specifications and the one plugin manager live with the host, in `agent/plugin_registry.py` (pluggy, as
simonw/llm: HookSpecs, `hookimpl`, default_manager(); DEFAULT_PLUGINS and the `glm5.plugins` entry points; hooks
register_tools, register_benchmarks, register_environments, register_rewards, register_log_parsers). A hook is a
function marked `@hookimpl`, as the built-ins' are; a plain function named as a hook works too. Imports run one
way: a plugin imports `agent` (a tool subclasses agent.tools' Tool, as a third party's would); `agent` names the
built-ins only as strings it loads at run time.
"""
