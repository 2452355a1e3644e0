"""Plugins: built-ins register through the same hook as a third party; entry points are found and deduplicated."""

from __future__ import annotations

import importlib.metadata
import types

import pytest

from agent.plugin_registry import DEFAULT_PLUGINS, PluginContext, PluginManager
from agent.tools.base import OTHER, ToolResult
from agent.tools.registry import ToolRegistry


class EchoTool:
    name = "echo"
    kind = OTHER
    description = "Echo the text back."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def subject(self, args):
        return None

    def run(self, args, ctx):
        return ToolResult(args["text"])


third_party = types.SimpleNamespace(
    __name__="echo_plugin",
    register_tools=lambda register, context: register(EchoTool()),
    register_rewards=lambda register, context: register("always_one", lambda traj: 1.0),
)


def test_builtins_and_third_party_register_the_same_way():
    reg = ToolRegistry()
    pm = PluginManager(entry_points=False, extra=(third_party,))
    pm.register_tools(reg, PluginContext())
    assert reg.names() == ["read", "write", "edit", "glob", "grep", "bash", "todo", "terminal_open", "terminal_send",
                           "terminal_read", "terminal_resize", "terminal_close", "echo"]  # fmt: skip
    assert reg.schemas()[-1]["function"]["name"] == "echo"
    assert pm.rewards()["always_one"](None) == 1.0
    assert sorted(pm.benchmarks()) == ["swe:builtin", "swe:multilingual", "swe:repair-heldout", "swe:repair-train",
                                       "terminal:builtin", "terminal:repair-heldout", "terminal:repair-train"]  # fmt: skip
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(EchoTool())


def test_entry_points_are_loaded_once(monkeypatch):
    import plugins.builtin_tools

    eps = [
        importlib.metadata.EntryPoint("builtin_tools", "plugins.builtin_tools", "glm5.plugins"),
        importlib.metadata.EntryPoint("broken", "no_such_module_xyz", "glm5.plugins"),
    ]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps if group == "glm5.plugins" else [])
    pm = PluginManager()
    mods = [p for _, p in pm.plugins]
    assert mods.count(plugins.builtin_tools) == 1 and len(pm.plugins) == len(DEFAULT_PLUGINS)
    assert any("broken" in e for e in pm.load_errors)


def test_pyproject_declares_the_builtins_as_entry_points():
    from pathlib import Path

    import tomllib

    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    declared = set(data["project"]["entry-points"]["glm5.plugins"].values())
    assert declared == set(DEFAULT_PLUGINS)


def test_imports_run_one_way_agent_never_imports_the_plugins():
    """The built-ins import `agent` as a third party's plugin would; `agent` names them only as strings."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "agent"
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n == "plugins" or n.startswith("plugins.")]
    assert offenders == []


def test_marked_hooks_and_the_log_parser_hook():
    """A plugin on pluggy's marker registers as a plain one does; log parsers have a hook of their own."""
    from agent.plugin_registry import hookimpl

    class Marked:
        @hookimpl
        def register_log_parsers(self, register, context):
            register("tap", lambda log: {})

    pm = PluginManager(entry_points=False, extra=(Marked(),))
    assert list(pm.log_parsers()) == ["tap"] and "swe:builtin" in pm.benchmarks()
