"""The environment kinds by name: `local` (bubblewrap over a folder of the trial) is the default, `docker` the
second; plugins add more through `register_environments(register, context)` -> register(name, factory), where
`factory(spec: EnvSpec) -> Environment` (agent/plugin_registry.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent import plugin_registry
from agent.bench.docker_env import DockerEnvironment
from agent.bench.environments import Environment, EnvSpec
from agent.bench.local_env import LocalEnvironment


def environment_kinds(context: Any = None) -> dict[str, Callable[[EnvSpec], Environment]]:
    """The built-in kinds plus every plugin's `register_environments`."""
    builtin: dict[str, Callable[[EnvSpec], Environment]] = {"local": LocalEnvironment, "docker": DockerEnvironment}
    return {**builtin, **plugin_registry.default_manager().environments(context)}


def make_environment(kind: str, spec: EnvSpec) -> Environment:
    kinds = environment_kinds()
    if kind not in kinds:
        raise ValueError(f"unknown environment {kind!r}; known: {', '.join(sorted(kinds))}")
    return kinds[kind](spec)
