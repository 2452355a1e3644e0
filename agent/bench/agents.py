"""The agents a trial can run: glm5 itself, the oracle, nop, and any external command.

    glm5      the very session `glm5 code -p` builds (agent/builder.py) and runs (agent/headless.py): same loop,
              tools, prompts and permission checks, in `auto` mode (nothing asks; deny rules and the path fence
              hold), its bash commands in the trial's sandbox, network off. The task repository's own
              .glm5/settings (hooks, MCP servers) are not read: a task is hostile input.
    oracle    SWE: applies the gold patch; terminal: runs solution/solve.sh (copied to /solution).
    nop       changes nothing (a task it resolves is broken).
    cmd:"..." any program, run in /app inside the sandbox with the task text on stdin and in $GLM5_TASK; the
              network is on for it, since it must reach its own model.
Every agent leaves trial_dir/trajectory.jsonl (schema glm5-trajectory/1) so trials read alike; glm5's is its
full session record with token ids and logprobs as the server returned them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.bench.environments import APP, SOLUTION, InfraError
from agent.bench.grading import apply_patch
from agent.bench.tasks import SWETask, TerminalTask
from agent.session import open_writer
from agent.settings import Limits, load_settings
from agent.trajectory import SCHEMA  # noqa: F401 (the schema every trial's trajectory.jsonl follows)

Task = SWETask | TerminalTask


@dataclass
class AgentOutcome:
    exit_status: str  # submitted, limits_exceeded, error, ... (glm5's), or done / failed for the others
    trajectory: Path | None = None
    stats: dict[str, Any] = field(default_factory=dict)  # steps, prompt_tokens, completion_tokens, cost_usd
    infra_error: str | None = None  # the endpoint stayed down, the environment died: not the agent's fault
    final: str = ""


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int = 100
    timeout_s: float | None = None  # wall time for the agent phase
    max_cost_usd: float | None = None
    memory_mb: int | None = None


class BenchAgent(Protocol):
    name: str

    def run(self, task: Task, env: Any, trial_dir: Path, limits: AgentLimits, *, attempt: int = 0) -> AgentOutcome:
        """One attempt at `task`; `attempt` is its index among the task's k (an agent that samples seeds by it)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What identifies this agent in config.json (a change refuses to resume)."""
        ...


def task_prompt(task: Task) -> str:
    if isinstance(task, SWETask):
        return (f"<issue>\n{task.problem_statement.strip()}\n</issue>\n\nResolve the issue above by changing the "
                "repository in your working folder. Do not change the tests unless the issue asks for it.")  # fmt: skip
    return task.instruction.strip()


def _simple_trajectory(trial_dir: Path, agent: str, task: Task, status: str, **extra: Any) -> Path:
    path = trial_dir / "trajectory.jsonl"
    w = open_writer(path, {"id": f"{task.task_id}-{trial_dir.name}", "agent": agent, "model": None, **extra})
    w.write("message", index=0, message={"role": "user", "content": task_prompt(task)})
    w.write("end", exit_status=status, stats={}, final="")
    w.close()
    return path


class NopAgent:
    name = "nop"

    def describe(self) -> dict[str, Any]:
        return {"agent": "nop"}

    def run(self, task: Task, env: Any, trial_dir: Path, limits: AgentLimits, *, attempt: int = 0) -> AgentOutcome:
        return AgentOutcome("done", _simple_trajectory(trial_dir, "nop", task, "done"))


class OracleAgent:
    name = "oracle"

    def describe(self) -> dict[str, Any]:
        return {"agent": "oracle"}

    def run(self, task: Task, env: Any, trial_dir: Path, limits: AgentLimits, *, attempt: int = 0) -> AgentOutcome:
        if isinstance(task, SWETask):
            if not task.patch.strip():
                raise InfraError(f"{task.instance_id} has no gold patch for the oracle")
            method, log = apply_patch(env, task.patch, "gold.diff", inside=SOLUTION)
            status = "done" if method else "failed"
        else:
            if not (task.solution_dir / "solve.sh").is_file():
                raise InfraError(f"{task.path}: solution/solve.sh is missing (the oracle has nothing to run)")
            env.copy_in(task.solution_dir, SOLUTION)
            r = env.exec(f"bash {SOLUTION}/solve.sh", cwd=task.workdir, timeout_s=limits.timeout_s)
            status, log = ("done" if r.returncode == 0 else "failed"), r.output
        (trial_dir / "agent.log").write_text(log)
        return AgentOutcome(status, _simple_trajectory(trial_dir, "oracle", task, status))


class CmdAgent:
    name = "cmd"

    def __init__(self, command: str):
        self.command = command

    def describe(self) -> dict[str, Any]:
        return {"agent": "cmd", "command": self.command}

    def run(self, task: Task, env: Any, trial_dir: Path, limits: AgentLimits, *, attempt: int = 0) -> AgentOutcome:
        text = task_prompt(task)
        kw: dict[str, Any] = {"network": True} if getattr(env, "name", "") == "local" else {}
        t0 = time.monotonic()
        r = env.exec(self.command, cwd=APP, timeout_s=limits.timeout_s, env={"GLM5_TASK": text}, stdin=text, **kw)
        (trial_dir / "agent.log").write_text(r.output)
        status = "timeout" if r.timed_out else ("done" if r.returncode == 0 else f"exit {r.returncode}")
        path = _simple_trajectory(trial_dir, "cmd", task, status, command=self.command)
        return AgentOutcome(status, path, {"seconds": round(time.monotonic() - t0, 3)}, final=r.output[-2000:])


class BenchSandbox:
    """What glm5's Environment wraps its commands with: the trial's environment (so /app, /logs are there)."""

    active = True
    warning = None

    def __init__(self, env: Any):
        self.env = env

    def wrap(self, argv: list[str], root: Path, cwd: Path, scratch: Path, tty: bool = False, **_: Any) -> list[str]:
        cwd = Path(cwd)
        app = Path(self.env.app_dir)
        inside = APP if cwd == app else (f"{APP}/{cwd.relative_to(app)}" if app in cwd.parents else str(cwd))
        # a terminal session's program needs a terminal in the container (docker exec -t); bubblewrap passes ours
        return self.env.wrap(argv, inside, tty=True) if tty and getattr(self.env, "name", "") == "docker" \
            else self.env.wrap(argv, inside)  # fmt: skip


class Glm5Agent:
    name = "glm5"

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 max_turns: int | None = None, *, api_key_env: str | None = None, provider: str | None = None,
                 temperature: float | None = None, extra_body: dict[str, Any] | None = None,
                 client: Any = None, profile: str | None = None, seed: int | None = None):  # fmt: skip
        """Endpoint and model as `glm5 code` takes them (flags > GLM5_* > config > defaults). `api_key` is the key
        itself; `api_key_env` names a variable holding it (the CLI's way). `max_turns` overrides the trial's
        limit. `client` replaces the HTTP client with any object speaking the loop's Model protocol (the RL
        orchestrator's in-process model); one whose `failure` attribute is set after the run failed as infra.
        `profile`: the agent profile (agent/profiles.py; None: the config's, else full). `seed`: each attempt's
        requests carry seeds derived from (seed, task, attempt) and the request's index (`trial_seed`), so a
        server that honors OpenAI's `seed` samples the same sessions again, and two models benched with the same
        seed are compared on common random numbers; None: the server draws its own."""
        self.base_url, self.model, self.api_key, self.api_key_env = base_url, model, api_key, api_key_env
        self.provider, self.max_turns, self.temperature = provider, max_turns, temperature
        self.extra_body = dict(extra_body or {})
        self.client = client
        self.profile = profile
        self.seed = seed

    def settings(self, trial_dir: Path, limits: AgentLimits, attempt: tuple[str, int] | None = None) -> Any:
        """The trial's settings; `attempt` (task id, index) seeds its requests when a seed is set (--seed, else
        the user's `[agent] seed`): each attempt its own draws, never one seed for all k."""
        flags = {"provider": self.provider, "base_url": self.base_url, "model": self.model,
                 "api_key_env": self.api_key_env, "mode": "auto", "profile": self.profile}  # fmt: skip
        s = load_settings(None, flags)  # the user's config only: never the task repository's .glm5/
        p = s.provider
        if self.extra_body:
            p = dataclasses.replace(p, extra_body=tuple(sorted({**dict(p.extra_body), **self.extra_body}.items())))
        lim = Limits(max_steps=self.max_turns or limits.max_turns, max_tokens=s.limits.max_tokens,
                     max_cost_usd=limits.max_cost_usd or s.limits.max_cost_usd, max_wall_s=limits.timeout_s)  # fmt: skip
        return dataclasses.replace(s, provider=p, limits=lim, mode="auto", sandbox=True, network=False, hooks={},
                                   mcp_servers={}, sessions_dir=str(trial_dir / "session"),
                                   temperature=self.temperature if self.temperature is not None else s.temperature,
                                   seed=_attempt_seed(self.seed if self.seed is not None else s.seed, attempt))  # fmt: skip

    def describe(self) -> dict[str, Any]:
        s = load_settings(None, {"provider": self.provider, "base_url": self.base_url, "model": self.model,
                                 "profile": self.profile})  # fmt: skip
        p = s.provider
        out = {"agent": "glm5", "base_url": p.base_url, "model": p.model, "temperature": self.temperature,
               "extra_body": self.extra_body, "profile": s.profile}  # fmt: skip
        seed = self.seed if self.seed is not None else s.seed
        if seed is not None:  # (absent when unset: run folders made before it resume as they were)
            out["seed"] = seed
        return out

    def run(self, task: Task, env: Any, trial_dir: Path, limits: AgentLimits, *, attempt: int = 0) -> AgentOutcome:
        # the agent's whole stack (builder, headless, client: about 0.5 s to import) only for a glm5 trial: oracle,
        # nop and cmd runs, and `bench validate`, never load it
        from agent.builder import build_session
        from agent.headless import HeadlessUI, run_headless

        settings = self.settings(trial_dir, limits, (task.task_id, attempt))
        if isinstance(task, TerminalTask) and settings.terminal is None:  # the terminal tools, in any profile
            settings = dataclasses.replace(settings, terminal=True)
        out, err = io.StringIO(), io.StringIO()
        ui = HeadlessUI("json", "auto", out=out, err=err)
        client = self.client
        if client is None and self.api_key is not None:
            from agent.client import ChatClient, ClientConfig

            p = settings.provider
            client = ChatClient(ClientConfig(base_url=p.base_url, model=p.model, api_key=self.api_key,
                                             stream=settings.stream, temperature=settings.temperature,
                                             extra_body=dict(p.extra_body), seed=settings.seed))  # fmt: skip
        # the model is shown the trial's folder as /app, where its commands run, and the task's date: every trial's
        # prompt is the same (a seeded bench samples the same sessions in any output folder, on any day) and no
        # host path is in a trajectory
        session = build_session(env.app_dir, settings, ui, model=client, shown_root=APP, shown_date=task_date(task))
        # the session's commands go through the trial's environment, with its child environment
        session.agent.env.sandbox = BenchSandbox(env)
        session.agent.env.env = env.child_env() if hasattr(env, "child_env") else None
        prompt = task_prompt(task)
        run_headless(session, prompt, ui)
        (trial_dir / "agent.log").write_text(err.getvalue())
        summary = json.loads(out.getvalue().strip().splitlines()[-1])
        path = trial_dir / "trajectory.jsonl"
        os.replace(summary["trajectory"], path)
        final = summary.get("result") or ""
        infra = None
        if summary["exit_status"] == "error" and final.startswith("model endpoint error"):
            infra = final  # headless's wording for an APIError after the client's retries
        if getattr(self.client, "failure", None) is not None:
            infra = str(self.client.failure)
        return AgentOutcome(summary["exit_status"], path, summary.get("stats") or {}, infra, final)


def task_date(task: Task) -> str:
    """The date a bench session's prompt gives: a SWE-bench task's `created_at` day (when its issue was filed),
    else "unknown" (never the day the bench ran: a rerun must send the same prompt)."""
    created = str(getattr(task, "extra", {}).get("created_at") or "")[:10]
    return created if re.fullmatch(r"\d{4}-\d{2}-\d{2}", created) else "unknown"


def trial_seed(seed: int, task_id: str, attempt: int) -> int:
    """The first request seed of `attempt` at `task_id` in a run seeded `seed`: the same on every machine, apart
    for every (task, attempt) (its requests take the next ones: ChatClient adds the request's index)."""
    digest = hashlib.sha256(f"glm5-bench:{seed}:{task_id}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


def _attempt_seed(seed: int | None, attempt: tuple[str, int] | None) -> int | None:
    return None if seed is None or attempt is None else trial_seed(seed, *attempt)


def make_agent(spec: str, **glm5_options: Any) -> BenchAgent:
    """`glm5`, `oracle`, `nop` or `cmd:COMMAND`."""
    if spec == "glm5":
        return Glm5Agent(**glm5_options)
    if spec == "oracle":
        return OracleAgent()
    if spec == "nop":
        return NopAgent()
    if spec.startswith("cmd:") and spec[4:].strip():
        return CmdAgent(spec[4:].strip())
    raise ValueError(f'--agent {spec!r}: expected glm5, oracle, nop or cmd:"COMMAND"')
