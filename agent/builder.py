"""Assembles a working session from settings: environment, sandbox, tools (through plugins), model client,
trajectory, checkpoints, hooks and the Agent; new, or resumed from a trajectory.

Both interfaces (the TUI and headless `-p`) start here, so they behave the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import context, profiles
from agent.checkpoints import Checkpoints, git_root
from agent.child_env import scrubbed_env
from agent.client import ChatClient, ClientConfig
from agent.environment import Environment
from agent.hooks import Hooks
from agent.loop import Agent, AgentConfig
from agent.permissions import Permissions
from agent.plugin_registry import PluginContext, PluginManager, default_manager
from agent.sandbox import Sandbox
from agent.session import find_session, git_info, new_id, open_writer, scratch_dir, sessions_dir
from agent.settings import DEFAULT_CONTEXT_WINDOW, Settings
from agent.tools.registry import ToolRegistry
from agent.trajectory import Trajectory
from agent.ui import AgentUI


@dataclass
class Session:
    id: str
    path: Path
    agent: Agent
    settings: Settings
    resumed: bool = False
    warnings: list[str] = field(default_factory=list)
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self.closers):
            try:
                c()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.closers.clear()


def build_session(
    cwd: Path,
    settings: Settings,
    ui: AgentUI | None = None,
    resume: str | None = None,
    continue_latest: bool = False,
    model: Any = None,
    plugin_manager: PluginManager | None = None,
    shown_root: str | None = None,
    shown_date: str | None = None,
) -> Session:
    """`resume` is a session id (prefix); `continue_latest` picks the newest session. `model` replaces the client.
    `shown_root`, `shown_date`: the path the model is shown for the repository (a bench trial's /app) and the date
    its prompt gives (None: today): Environment.shown_root / shown_date."""
    cwd = Path(cwd).resolve()
    root = git_root(cwd) or cwd
    warnings: list[str] = []
    if git_root(cwd) is None:
        warnings.append(
            f"{cwd} is not in a git repository (or one whose core.worktree names another folder, which "
            "glm5 does not take as the repository): checkpoints, /undo and /rewind are off"
        )
    sid, path, traj = _locate(root, settings, resume, continue_latest)

    sandbox = Sandbox(settings.sandbox, settings.network, getattr(settings, "limits_for_sandbox", None))
    if sandbox.warning:
        warnings.append(sandbox.warning)
    if getattr(settings, "ignored", ()):
        warnings.append(
            f"{root} is not a trusted folder: its settings that widen permissions are ignored "
            f"({', '.join(settings.ignored)}); trust it with `glm5 code --trust` if you wrote them"
        )
    env = Environment(
        root,
        cwd,
        sandbox,
        scratch_dir(root, sid),
        settings.additional_dirs,
        env=scrubbed_env(getattr(settings, "env", None), getattr(settings, "pass_env", ())),
        limits=getattr(settings, "limits_for_sandbox", None),
        shown_root=shown_root,
        shown_date=shown_date,
    )

    registry = ToolRegistry()
    pctx = PluginContext(settings=settings, env=env)
    pm = plugin_manager or default_manager()
    pm.register_tools(registry, pctx)
    registry.restrict(
        profiles.tool_names(settings.profile, registry.names(), getattr(settings, "terminal", None)),
        profiles.schema_rewrite(settings.profile),
    )
    warnings += pm.load_errors + pctx.warnings

    client = model or _client(settings)
    p = settings.provider
    header = {
        "id": sid,
        "root": str(root),
        "cwd": str(cwd),
        "provider": p.name,
        "model": p.model,
        "base_url": p.base_url,
        "git": git_info(root),
        "tools": registry.schemas(),
        "settings": {"mode": settings.mode, "sandbox": sandbox.active, "network": settings.network},
    }
    writer = open_writer(path, header)
    checkpoints = Checkpoints(root, sid) if git_root(cwd) else None
    hooks = Hooks(settings.hooks, root, sid, str(path)) if settings.hooks else None
    agent = Agent(
        client,
        env,
        registry,
        Permissions.from_settings(settings),
        writer,
        _agent_config(settings, client),
        checkpoints=checkpoints,
        hooks=hooks,
        ui=ui,
        sandbox_warning=sandbox.warning,
    )
    if traj is not None:
        _resume(agent, traj)
    else:
        warnings += _start(agent, root, cwd, settings.profile, sandbox.warning)
    session = Session(sid, path, agent, settings, resumed=traj is not None, warnings=warnings)
    # env.close: background jobs and terminal sessions end with the session, however it ends
    session.closers = [env.close, *pctx.closers, writer.close, getattr(client, "close", lambda: None)]
    return session


def _locate(root: Path, settings: Settings, resume: str | None,
            continue_latest: bool) -> tuple[str, Path, Trajectory | None]:  # fmt: skip
    """The session's id, its trajectory's path and, when it is resumed, the trajectory read back."""
    folder = sessions_dir(root, settings.sessions_dir)
    if resume is not None or continue_latest:
        path = find_session(folder, resume, root=root)
        traj = Trajectory.load(path)
        return _session_id(traj.header.get("id"), path), path, traj
    sid = new_id()
    return sid, folder / f"{sid}.jsonl", None


def _client(settings: Settings) -> ChatClient:
    p = settings.provider
    return ChatClient(
        ClientConfig(
            base_url=p.base_url,
            model=p.model,
            api_key=p.api_key,
            stream=settings.stream,
            temperature=settings.temperature,
            extra_body=dict(p.extra_body),
            seed=settings.seed,
        )
    )


def _agent_config(settings: Settings, client: Any) -> AgentConfig:
    """The loop's limits, costs and context window: the provider's, else what the server says it serves."""
    p = settings.provider
    window = p.context_window
    if window is None and isinstance(client, ChatClient):
        window = client.served_context_window()
    return AgentConfig(
        limits=settings.limits,
        context_window=window or DEFAULT_CONTEXT_WINDOW,
        compact_ratio=settings.compact_ratio,
        input_cost_per_mtok=p.input_cost_per_mtok,
        output_cost_per_mtok=p.output_cost_per_mtok,
        send_reasoning=settings.send_reasoning,
        profile=settings.profile,
    )


def _resume(agent: Agent, traj: Trajectory) -> None:
    """The conversation, turns, totals and test labels as the trajectory left them; a `resume` record."""
    agent.messages = traj.messages()
    agent.turns = traj.turns()
    u = traj.usage()
    agent.stats.steps, agent.stats.prompt_tokens = u["steps"], u["prompt_tokens"]
    agent.stats.completion_tokens, agent.stats.cost_usd = u["completion_tokens"], u["cost_usd"]
    agent.tests = list(traj.outcome().get("tests", []))  # labels accumulate across processes
    agent.writer.write("resume", n_messages=len(agent.messages))


def _start(agent: Agent, root: Path, cwd: Path, profile: str, sandbox_warning: str | None) -> list[str]:
    """A new session's SessionStart hooks and system prompt (with what the hooks added); their warnings."""
    extra, warnings = "", []
    if agent.hooks:
        h = agent.hooks.run("SessionStart", {"source": "startup"})
        warnings += h.warnings
        extra = h.context
    env = agent.env
    system = context.system_prompt(root, cwd, sandbox_warning, extra, profile, env.shown_root, env.shown_date)
    agent.add_message({"role": "system", "content": system})
    return warnings


def _session_id(recorded: Any, path: Path) -> str:
    """The id a resumed session goes on under: the one its header records, or its file's name when the header has
    none (a session written elsewhere). It names the scratch folder, so one that is not a plain name (`../x`) is
    never taken: the session goes on under a new id."""
    for sid in (recorded, path.stem):
        if isinstance(sid, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", sid) and ".." not in sid:
            return sid
    return new_id()
