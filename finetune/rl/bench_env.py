"""The bench as the RL environment: the same tasks, per-trial sandboxes and grading as `glm5 bench`, so "solved"
means one thing in evaluation and in training.

A session is one bench trial (agent.bench.trial.run_trial): a fresh environment (a clone of the task's repository
at base_commit behind /app, bubblewrap; or docker), `glm5 code`'s agent loop with its tools and prompts working in
it, the working tree's diff graded by the bench in a fresh checkout (SWE) or the task's verifier (terminal). The
agent's model is the session's SessionModel instead of an HTTP client; everything else is the bench's agent.

Reward: resolved 1.0, else 0.0; with partial credit the fraction of FAIL_TO_PASS tests that pass; with a hybrid
spec (rewards.py) the bench's reward is the "rules" part. An infra_error trial (no environment, a verifier that
wrote nothing) is an environment failure for the crash-group rule, never a 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.bench.agents import Glm5Agent
from agent.profiles import check_profile
from finetune.rl.rollout import ENV_ERROR, OK, Grade


def load_bench_tasks(env: str, tasks_file: Path | None, task_dirs: list[Path]) -> list:
    from agent.bench.tasks import load_swe_tasks, load_terminal_tasks

    return load_swe_tasks(tasks_file) if env == "swe" else load_terminal_tasks(task_dirs)


class RLBenchAgent(Glm5Agent):
    """The bench's glm5 agent (its settings, loop and infra rules) with the RL session's model as its client."""

    name = "glm5-rl"

    def __init__(self, model, max_turns: int, profile: str | None = None):
        super().__init__(max_turns=max_turns, client=model, profile=profile)

    def describe(self) -> dict[str, Any]:
        return {"agent": self.name}


class BenchSession:
    def __init__(self, bench: BenchEnv, task, workdir: Path):
        self.bench, self.task, self.workdir = bench, task, Path(workdir)
        self.result = None

    def run(self, model) -> None:
        from agent.bench.trial import run_trial

        self.result = run_trial(self.task, RLBenchAgent(model, self.bench.max_turns, self.bench.profile), self.workdir,
                                self.bench.trial_config(self.workdir))  # fmt: skip

    def grade(self) -> Grade:
        r = self.result
        if r is None or r.status == "infra_error":
            return Grade(None, None, ENV_ERROR, r.reason if r else "the trial did not run")
        reward = 1.0 if r.resolved else 0.0
        f2p = getattr(self.task, "FAIL_TO_PASS", ())
        if self.bench.partial_credit and f2p:
            reward = sum(r.tests.get(t) in ("PASSED", "XFAIL") for t in f2p) / len(f2p)
        elif r.rewards and not f2p:
            reward = float(r.reward)  # a terminal task's own reward
        detail = {"status": r.status, "tests": r.tests, "trial_dir": r.trial_dir, "steps": r.steps}
        spec = self.bench.hybrid
        if spec is None:
            return Grade(reward, bool(r.resolved), OK, detail=detail)
        patch = Path(r.trial_dir, "patch.diff")
        result_text = (patch.read_text() if patch.is_file() else "")[:20000]
        total, parts = spec.score(getattr(self.task, "text", ""), result_text, reward)
        if total is None:
            return Grade(None, bool(r.resolved), ENV_ERROR, "no part of the reward could score this session")
        return Grade(total, bool(r.resolved), OK, detail={**detail, **parts})

    def close(self) -> None:
        pass


class BenchEnv:
    def __init__(self, kind: str, max_turns: int = 30, partial_credit: bool = False, reward=None,
                 environment: str = "local", cache_dir: Path = Path(".glm5-bench-cache"),
                 profile: str | None = None):  # fmt: skip
        """`profile`: the agent profile the sessions run (agent/profiles.py: "full" or "compact"; None: the
        config's, else full), the same tools and prompt `glm5 code --profile` gives."""
        from finetune.rl.rewards import HybridReward

        self.name, self.max_turns, self.partial_credit = kind, max_turns, partial_credit
        self.profile = check_profile(profile) if profile is not None else None
        self.hybrid = HybridReward(reward) if reward is not None else None
        from agent.bench.repos import RepoCache

        self.environment, self.cache_dir = environment, Path(cache_dir).resolve()
        # One cache for every session: its per-repository locks keep concurrent sessions from cloning at once.
        self.repos = RepoCache(self.cache_dir)
        self.hide: tuple[Path, ...] = ()  # set by isolate(): the run's folders and task files

    def isolate(self, run_dirs: list[Path], tasks: list) -> None:
        """Hide the run's folders (other sessions, their graded output, the trainer's state) and every task file
        it reads (training and held-out) from each session, as `glm5 bench` hides its run folder from a trial:
        the same list (agent.bench.trial.run_hidden), the same view. The repository cache is hidden by
        hidden_from_trials for both."""
        from agent.bench.trial import run_hidden

        self.hide = run_hidden(run_dirs, tasks)

    def trial_config(self, workdir: Path):
        """The bench's TrialConfig for the session in `workdir`: this env's sandbox kind, cache, turns and hidden
        set, which holds the folder of every session beside it even when isolate() was not called."""
        from agent.bench.agents import AgentLimits
        from agent.bench.trial import TrialConfig

        hide = tuple(dict.fromkeys((*self.hide, Path(workdir).resolve().parent)))
        return TrialConfig(env=self.environment, cache_dir=self.cache_dir, repos=self.repos,
                           limits=AgentLimits(max_turns=self.max_turns), hide=hide)  # fmt: skip

    def reset(self, task, workdir: Path, sample: int = 0) -> BenchSession:
        return BenchSession(self, task, workdir)
