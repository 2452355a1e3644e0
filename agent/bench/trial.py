"""One attempt at one task, end to end: environment up, agent, prediction captured, graded, trial folder written.

    RUN/trials/<instance>/<attempt>/
        trajectory.jsonl   the agent's session (glm5-trajectory/1), its outcome labels holding reward, resolved
                           and each test's status (training data as it is)
        patch.diff         the prediction: the working tree's diff against base_commit
        test_output.txt    what the grader ran and what it printed
        report.json        the TrialResult below (what results.jsonl gets one line of)
        agent.log          the agent's stderr / output
        work/, verify/     the environments' folders (logs kept; the checkouts removed unless keep_workdirs)
A trial starts from an empty folder: one interrupted before its report was written reruns from scratch. Anything
that is not the agent's doing (no environment, the endpoint stayed down, the verifier wrote nothing) comes back
as status infra_error with `resolved` null; the runner retries those and keeps them out of the score.
The RL orchestrator calls run_trial directly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.bench.agents import AgentLimits, BenchAgent
from agent.bench.docker_env import BASE_IMAGE
from agent.bench.env_kinds import make_environment
from agent.bench.environments import EnvSpec, InfraError
from agent.bench.grades import INFRA_ERROR, Grade, infra
from agent.bench.grading import frozen, grade_swe, grade_terminal, patch_files
from agent.bench.harness_specs import build_context, image_name, local_setup
from agent.bench.repos import RepoCache, working_tree_diff
from agent.bench.tasks import SWETask, TerminalTask
from agent.trajectory import TrajectoryWriter

ENV_SKIP = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml")


@dataclass
class TrialConfig:
    env: str = "local"
    cache_dir: Path = Path(".glm5-bench-cache")
    repos: RepoCache | None = None
    limits: AgentLimits = field(default_factory=AgentLimits)
    test_timeout_s: float = 1800.0
    flaky_reruns: int = 0
    keep_workdirs: bool = False
    hide: tuple[Path, ...] = ()  # hidden from every trial besides its task's own files (the run folder)
    # a task file may ask for the network (task.toml allow_internet); only the user turns it on (issue 40)
    task_network: bool = field(default_factory=lambda: os.environ.get("GLM5_BENCH_TASK_NETWORK") == "1")


@dataclass
class TrialResult:
    instance_id: str
    attempt: int
    status: str  # resolved | unresolved | infra_error
    resolved: bool | None
    reward: float
    tests: dict[str, str]
    agent: str
    exit_status: str = ""
    reason: str = ""
    failing_tests: list[str] = field(default_factory=list)
    flaky_tests: list[str] = field(default_factory=list)
    # files of the prediction that configure how the tests run (conftest.py, pytest.ini, ...): graded as the harness
    # grades them, and named, since such a file can also rewrite what the tests report
    test_config_changed: list[str] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)
    patch_applied: bool | None = None
    patch_lines: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    seconds_agent: float = 0.0
    seconds_grade: float = 0.0
    try_: int = 1  # which infra retry produced this result (1 = the first)
    trial_dir: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["try"] = d.pop("try_")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        d = dict(d)
        d["try_"] = d.pop("try", 1)
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})


def _copy_environment(src: Path, dest: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(*ENV_SKIP))
    else:
        dest.mkdir(parents=True)


def task_files(task: SWETask | TerminalTask) -> list[Path]:
    """Where a task's answers are on the host: the file it came from (a JSONL holds every task's gold patch; a
    suite's instance file sits with the others, so their folder), or a terminal task's own folder (its solution
    and tests; /app is a copy of its environment)."""
    if isinstance(task, TerminalTask):
        return [task.path]
    if task.source:
        src = Path(re.sub(r":(\d+|item \d+|row \d+)$", "", task.source))
        # a harness task repo's tasks/<id>/task.yaml: every task's folder (gold.patch, test.patch) is beside it
        return [src.parent if src.suffix == ".toml" else src.parent.parent if src.name == "task.yaml" else src]
    return []


def run_hidden(run_dirs: list[Path], tasks: list) -> tuple[Path, ...]:
    """TrialConfig.hide for a run, `glm5 bench` and `glm5 finetune rl --env swe|terminal` alike: its folders
    (other trials or sessions, their hidden test output, state) and the files of every task it reads (training
    and held-out ones: each holds gold patches)."""
    out = [Path(d) for d in run_dirs]
    for t in tasks:
        out += task_files(t)
    return tuple(dict.fromkeys(p.resolve() for p in out))


def hidden_from_trials(task: SWETask | TerminalTask, config: TrialConfig) -> tuple[Path, ...]:
    """What a trial's commands must not read, the one list for the bench and RL: the run's (config.hide,
    run_hidden), the repository cache (its mirrors hold the later history, the upstream fix among it), this
    task's files, and the built-in suites' data, whichever file the task was read from (a copy of a built-in row
    still has its gold there)."""
    # the built-in suites ship beside this package (plugins/ is not imported from agent/: imports run one way)
    out = [*config.hide, Path(config.cache_dir), Path(__file__).resolve().parents[2] / "plugins" / "bench_suites"]
    if config.repos is not None:
        out.append(config.repos.dir)
    out += task_files(task)
    Path(config.cache_dir).mkdir(parents=True, exist_ok=True)  # made now, so hidden before the first clone
    return tuple(dict.fromkeys(p.resolve() for p in out if p.exists()))


def swe_dockerfile(task: SWETask, config: TrialConfig) -> Path | None:
    """A SWE row's own `dockerfile` (its environment, as a harness task repo carries one) as a build context under
    the cache, for docker mode; None when the row has none."""
    text = task.extra.get("dockerfile")
    if not isinstance(text, str) or not text.strip():
        return None
    ctx = Path(config.cache_dir).resolve() / "dockerfiles" / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not (ctx / "Dockerfile").is_file():
        ctx.mkdir(parents=True, exist_ok=True)
        tmp = ctx / "Dockerfile.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, ctx / "Dockerfile")
    return ctx


def env_spec(task: SWETask | TerminalTask, folder: Path, config: TrialConfig) -> EnvSpec:
    hidden = hidden_from_trials(task, config)
    if isinstance(task, SWETask):
        repos = config.repos or RepoCache(config.cache_dir)
        if config.env == "docker" and task.eval_script:
            # the harness's image, as `swebench eval` runs it: the repository installed at /testbed (built from the
            # task repo's Dockerfile where it is not here and cannot be pulled)
            return EnvSpec(folder, image=task.image or image_name(task.instance_id), workdir="/testbed",
                           dockerfile_dir=build_context(task, config.cache_dir),
                           memory_mb=config.limits.memory_mb, cache_dir=config.cache_dir, hidden=hidden)  # fmt: skip
        setup = task.setup or (local_setup(task) if config.env == "local" else None)
        dockerfile = swe_dockerfile(task, config) if config.env == "docker" and not task.image else None
        return EnvSpec(folder, app_source=lambda d: repos.checkout(task.repo, task.base_commit, d), setup=setup,
                       setup_key=f"{task.repo}@{task.version or task.environment_setup_commit}",
                       python=(task.python or None) if config.env == "local" else None,
                       image=task.image or (BASE_IMAGE if config.env == "docker" and not dockerfile else None),
                       dockerfile_dir=dockerfile,
                       cache_dir=config.cache_dir,
                       memory_mb=config.limits.memory_mb, hidden=hidden)  # fmt: skip
    context = task.environment_dir if task.environment_dir.is_dir() else None
    # the task's file may narrow the user's limits, never widen them: its memory under the user's cap, its
    # network only where the user allowed tasks the network
    caps = [m for m in (task.memory_mb, config.limits.memory_mb) if m]
    memory = min(caps) if caps else None
    return EnvSpec(folder, app_source=lambda d: _copy_environment(task.environment_dir, d),
                   image=task.docker_image, dockerfile_dir=context,
                   memory_mb=memory, cpus=task.cpus, network=task.allow_internet and config.task_network,
                   cache_dir=config.cache_dir, protect_git=False, workdir=task.workdir, hidden=hidden)  # fmt: skip


def _grade(
    task, agent: BenchAgent, trial_dir: Path, config: TrialConfig, times: dict[str, float], attempt: int = 0
) -> tuple[Grade, Any, str]:
    limits = config.limits
    if isinstance(task, TerminalTask) and task.agent_timeout_s and not limits.timeout_s:
        limits = AgentLimits(limits.max_turns, task.agent_timeout_s, limits.max_cost_usd, limits.memory_mb)
    env = make_environment(config.env, env_spec(task, trial_dir / "work", config))
    outcome = None
    patch = ""
    try:
        env.start()
        t0 = time.monotonic()
        outcome = agent.run(task, env, trial_dir, limits, attempt=attempt)
        times["agent"] = time.monotonic() - t0
        if outcome.infra_error:
            return infra(outcome.infra_error), outcome, patch
        with frozen(env):  # nothing the agent left running moves files under the host's git
            if isinstance(task, SWETask):
                # in the harness's image the setup's own commit is HEAD: the answer is what changed since
                base = "HEAD" if getattr(env, "harness_image", False) else task.base_commit
                patch = working_tree_diff(env.app_dir, base)
            elif (env.app_dir / ".git").exists():
                patch = working_tree_diff(env.app_dir, "HEAD", agents_git=True)  # the agent's own .git
        (trial_dir / "patch.diff").write_text(patch, encoding="utf-8")
        t1 = time.monotonic()
        if isinstance(task, TerminalTask):
            # Harbor's default: the verifier runs where the agent worked, with the tests copied in only now
            grade = grade_terminal(task, env, env.logs / "verifier")
        else:
            env.stop()
            venv = make_environment(config.env, env_spec(task, trial_dir / "verify", config))
            try:
                venv.start()
                grade = grade_swe(task, patch, venv, timeout_s=config.test_timeout_s, flaky_reruns=config.flaky_reruns)
            finally:
                venv.stop()
        times["grade"] = time.monotonic() - t1
        return grade, outcome, patch
    finally:
        env.stop()


def run_trial(task: SWETask | TerminalTask, agent: BenchAgent, trial_dir: Path, config: TrialConfig,
              attempt: int = 0, try_: int = 1) -> TrialResult:  # fmt: skip
    trial_dir = Path(trial_dir).resolve()
    shutil.rmtree(trial_dir, ignore_errors=True)  # what an interrupted try left is not this try's
    trial_dir.mkdir(parents=True)
    t0 = time.monotonic()
    times: dict[str, float] = {}
    outcome, patch = None, ""
    try:
        grade, outcome, patch = _grade(task, agent, trial_dir, config, times, attempt)
    except InfraError as e:
        grade = infra(str(e))
    except Exception as e:  # noqa: BLE001 - a bug in one trial must not stop the run; it is kept, labelled
        (trial_dir / "error.txt").write_text(traceback.format_exc())
        grade = infra(f"internal error: {type(e).__name__}: {e} (see error.txt)")
    stats = outcome.stats if outcome else {}
    if isinstance(task, TerminalTask) and task.allow_internet and not config.task_network:
        grade.reason = (grade.reason + "; " if grade.reason else "") + (
            "the task asked for the network (task.toml allow_internet), which stayed off: only the user turns it on "
            "(GLM5_BENCH_TASK_NETWORK=1)")
    result = TrialResult(
        instance_id=task.task_id, attempt=attempt, status=grade.status, resolved=grade.resolved,
        reward=float(grade.reward), tests=grade.tests, agent=agent.name,
        exit_status=outcome.exit_status if outcome else "", reason=grade.reason,
        failing_tests=grade.failing_tests if grade.status != INFRA_ERROR else [], flaky_tests=grade.flaky_tests,
        test_config_changed=config_files_changed(patch),
        rewards=grade.rewards, patch_applied=grade.patch_applied, patch_lines=patch.count("\n"),
        prompt_tokens=int(stats.get("prompt_tokens") or 0), completion_tokens=int(stats.get("completion_tokens") or 0),
        cost_usd=float(stats.get("cost_usd") or 0.0), steps=int(stats.get("steps") or 0),
        seconds=round(time.monotonic() - t0, 3), seconds_agent=round(times.get("agent", 0.0), 3),
        seconds_grade=round(times.get("grade", 0.0), 3), try_=try_, trial_dir=str(trial_dir),
    )  # fmt: skip
    (trial_dir / "test_output.txt").write_text(grade.log, encoding="utf-8")
    label_trajectory(trial_dir / "trajectory.jsonl", result, grade)
    if not config.keep_workdirs:
        for d in ("work/app", "verify/app", "work/tmp", "verify/tmp", "work/root", "verify/root"):
            shutil.rmtree(trial_dir / d, ignore_errors=True)
    write_json(trial_dir / "report.json", result.as_dict())
    return result


TEST_CONFIG = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "sitecustomize.py", "usercustomize.py",
               "noxfile.py", ".pth")  # fmt: skip


def config_files_changed(patch: str) -> list[str]:
    """The files of `patch` that configure how tests run or what they report (a conftest.py hook can turn a
    failure into a pass, and the SWE-bench harness grades it all the same)."""
    return sorted(f for f in patch_files(patch) if f.rsplit("/", 1)[-1].endswith(TEST_CONFIG)) if patch else []


def label_trajectory(path: Path, result: TrialResult, grade: Grade) -> None:
    """The grade as outcome labels on the agent's trajectory (later labels win when read back)."""
    if not path.exists():
        return
    w = TrajectoryWriter(path)
    w.write("outcome", labels={"bench": {"instance_id": result.instance_id, "attempt": result.attempt},
                               "reward": result.reward, "resolved": result.resolved, "status": result.status,
                               "tests_status": result.tests, "failing_tests": result.failing_tests,
                               "flaky_tests": result.flaky_tests, "rewards": result.rewards})  # fmt: skip
    w.close()


def write_json(path: Path, obj: Any) -> None:
    """Whole or not at all: write a temporary file, fsync, rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
