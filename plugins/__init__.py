"""Extension points (Python entry points) and the built-in plugins that use them as a third party would.

    registry.py       PluginManager: loads DEFAULT_PLUGINS and the `glm5.plugins` entry points; hooks
                      register_tools / register_benchmarks / register_rewards
    builtin_tools.py  the agent's built-in tools
    mcp_tools.py      tools of the MCP servers named in settings
    builtin_rewards.py  RL rewards for `glm5 finetune rl`: regex, command

`agent.builder` asks the manager to register tools into the agent's ToolRegistry when a session starts.
"""
