"""The plugin registry: a small hookspec in the style of simonw/llm.

A plugin is a module (or object) with any of these functions:
    register_tools(register, context)       register(tool) for each agent tool it provides
    register_benchmarks(register, context)  register(name, suite) for bench (read by `glm5 bench`)
    register_rewards(register, context)     register(name, fn) for RL rewards (read by `glm5 finetune`)
    register_environments(register, context) register(name, factory) for bench environments (agent/bench)
Plugins come from the entry-point group `glm5.plugins` (pyproject: [project.entry-points."glm5.plugins"]).
The built-ins are declared there too, and DEFAULT_PLUGINS loads them from a source tree that is not installed;
a module is loaded once however it was found.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ENTRY_POINT_GROUP = "glm5.plugins"
DEFAULT_PLUGINS = ("plugins.builtin_tools", "plugins.mcp_tools", "plugins.builtin_rewards", "plugins.builtin_bench")
HOOKS = ("register_tools", "register_benchmarks", "register_rewards", "register_environments")


@dataclass
class PluginContext:
    """What plugins may look at while registering: settings, the environment, and cleanups to run at exit."""

    settings: Any = None
    env: Any = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class PluginManager:
    def __init__(self, entry_points: bool = True, extra: tuple[Any, ...] = ()):
        self.plugins: list[tuple[str, Any]] = []
        self.load_errors: list[str] = []
        seen: set[int] = set()

        def add(name: str, obj: Any) -> None:
            if id(obj) not in seen:
                seen.add(id(obj))
                self.plugins.append((name, obj))

        for mod in DEFAULT_PLUGINS:
            add(mod, importlib.import_module(mod))
        if entry_points:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                try:
                    add(ep.name, ep.load())
                except Exception as e:  # noqa: BLE001 - a broken third-party plugin must not stop the agent
                    self.load_errors.append(f"plugin {ep.name!r} failed to load: {e}")
        for obj in extra:
            add(getattr(obj, "__name__", repr(obj)), obj)

    def call(self, hook: str, register: Callable[..., Any], context: PluginContext) -> None:
        if hook not in HOOKS:
            raise ValueError(f"unknown plugin hook {hook!r}")
        for _, plugin in self.plugins:
            fn = getattr(plugin, hook, None)
            if fn is not None:
                fn(register=register, context=context)

    def register_tools(self, registry: Any, context: PluginContext) -> None:
        self.call("register_tools", registry.register, context)

    def benchmarks(self, context: PluginContext | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.call("register_benchmarks", lambda name, suite: out.__setitem__(name, suite), context or PluginContext())
        return out

    def rewards(self, context: PluginContext | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.call("register_rewards", lambda name, fn: out.__setitem__(name, fn), context or PluginContext())
        return out
