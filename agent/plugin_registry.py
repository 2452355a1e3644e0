"""The plugin registry on pluggy, in the style of simonw/llm: hook specifications and one plugin manager.

A plugin is a module (or object) with any of these hooks; each gets `register` and `context` (a PluginContext):
    register_tools(register, context)        register(tool) for each agent tool it provides
    register_benchmarks(register, context)   register(name, suite) for bench (read by `glm5 bench`)
    register_rewards(register, context)      register(name, fn) for RL rewards (read by `glm5 finetune`)
    register_environments(register, context) register(name, factory) for bench environments (agent/bench)
    register_log_parsers(register, context)  register(name, fn) for bench log parsers (agent/bench/log_parsers.py)
A hook may be marked `@hookimpl` (this module's marker, as llm's `@llm.hookimpl`) or be a plain function of that
name, as plugins written before pluggy are. Plugins come from the entry-point group `glm5.plugins` (pyproject:
[project.entry-points."glm5.plugins"]). The built-ins are declared there too, and DEFAULT_PLUGINS loads them from a
source tree that is not installed; a module is loaded once however it was found. Hooks run in the order the plugins
were found (the built-ins first), so a later plugin's registration of a name replaces an earlier one's.
`default_manager()` is the one manager of the process, built on first use; the CLI and the agent ask it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

PROJECT = "glm5"
ENTRY_POINT_GROUP = "glm5.plugins"
DEFAULT_PLUGINS = ("plugins.builtin_tools", "plugins.mcp_tools", "plugins.builtin_rewards", "plugins.builtin_bench")
HOOKS = ("register_tools", "register_benchmarks", "register_rewards", "register_environments", "register_log_parsers")

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class HookSpecs:
    """What glm5 asks of plugins. Every hook is called with keywords and its return value is ignored."""

    @hookspec
    def register_tools(self, register: Callable[[Any], None], context: PluginContext) -> None:
        """register(tool) for each agent tool (agent.tools' Tool protocol)."""

    @hookspec
    def register_benchmarks(self, register: Callable[[str, Any], None], context: PluginContext) -> None:
        """register("<kind>:<name>", suite) for each benchmark suite (agent/bench/suites.py)."""

    @hookspec
    def register_rewards(self, register: Callable[[str, Any], None], context: PluginContext) -> None:
        """register(name, make) for each RL reward; make(spec) -> score(completion) (plugins/builtin_rewards.py)."""

    @hookspec
    def register_environments(self, register: Callable[[str, Any], None], context: PluginContext) -> None:
        """register(name, factory) for each bench environment; factory(spec: EnvSpec) -> Environment."""

    @hookspec
    def register_log_parsers(self, register: Callable[[str, Any], None], context: PluginContext) -> None:
        """register(name, parse) for each bench log parser; parse(log) -> {test: status}."""


@dataclass
class PluginContext:
    """What plugins may look at while registering: settings, the environment, and cleanups to run at exit."""

    settings: Any = None
    env: Any = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class PluginManager(pluggy.PluginManager):
    """The built-ins, the `glm5.plugins` entry points and `extra` objects, each registered once with pluggy.

    `plugins` lists (name, plugin) in the order they were found; `load_errors` says which entry points failed to
    load (a broken third-party plugin must not stop the agent)."""

    def __init__(self, entry_points: bool = True, extra: tuple[Any, ...] = ()):
        super().__init__(PROJECT)
        self.add_hookspecs(HookSpecs)
        self.plugins: list[tuple[str, Any]] = []
        self.load_errors: list[str] = []
        for mod in DEFAULT_PLUGINS:
            self._add(mod, importlib.import_module(mod))
        if entry_points:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                try:
                    self._add(ep.name, ep.load())
                except Exception as e:  # noqa: BLE001 - a broken third-party plugin must not stop the agent
                    self.load_errors.append(f"plugin {ep.name!r} failed to load: {e}")
        for obj in extra:
            self._add(getattr(obj, "__name__", repr(obj)), obj)
        # pluggy calls a hook's implementations last-registered first: registering in reverse keeps the order found
        for name, plugin in reversed(self.plugins):
            self.register(plugin, None if self.has_plugin(name) else name)

    def _add(self, name: str, obj: Any) -> None:
        if all(obj is not seen for _, seen in self.plugins):
            self.plugins.append((name, obj))

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        """A hook is a function marked @hookimpl, or (as in plugins written before pluggy) one named as a hook."""
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name in HOOKS and callable(getattr(plugin, name, None)):
            return {}
        return opts

    def collect(self, hook: str, context: PluginContext | None = None) -> dict[str, Any]:
        """name -> object, from every plugin's `hook` (register(name, obj)); a later plugin's name wins."""
        if hook not in HOOKS:
            raise ValueError(f"unknown plugin hook {hook!r}")
        out: dict[str, Any] = {}
        getattr(self.hook, hook)(register=out.__setitem__, context=context or PluginContext())
        return out

    def register_tools(self, registry: Any, context: PluginContext) -> None:
        self.hook.register_tools(register=registry.register, context=context)

    def benchmarks(self, context: PluginContext | None = None) -> dict[str, Any]:
        return self.collect("register_benchmarks", context)

    def rewards(self, context: PluginContext | None = None) -> dict[str, Any]:
        return self.collect("register_rewards", context)

    def environments(self, context: PluginContext | None = None) -> dict[str, Any]:
        return self.collect("register_environments", context)

    def log_parsers(self, context: PluginContext | None = None) -> dict[str, Any]:
        """Parsers from `register_log_parsers`, and (as before that hook) `log_parser:NAME` benchmark entries."""
        legacy = {k.split(":", 1)[1]: v for k, v in self.benchmarks(context).items()
                  if k.startswith("log_parser:") and callable(v)}  # fmt: skip
        return {**legacy, **self.collect("register_log_parsers", context)}


_manager: PluginManager | None = None
_lock = threading.Lock()


def default_manager() -> PluginManager:
    """The process's one PluginManager (built-ins and entry points), built on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager
