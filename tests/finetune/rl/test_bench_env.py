"""The bench as the RL environment (finetune/rl/bench_env.py) on the built-in SWE suite: a session is a bench
trial (its own clone of the task's repository, `glm5 code`'s agent loop and tools on the session's model, the
diff graded by the bench), its model calls are recorded token in, token out, and the rollout gets the bench's
verdict; an infra error is an environment failure, never a 0."""

from __future__ import annotations

from finetune.rl.bench_env import BenchEnv, load_bench_tasks
from finetune.rl.config import RLConfig
from finetune.rl.orchestrator import Orchestrator
from finetune.rl.rollout import ENV_ERROR, OK
from finetune.rl.server import InProcessServer
from plugins.bench_suites.swe_suite import SWESuite
from tests.finetune.rl.conftest import peaky_model


def test_a_bench_trial_is_a_rollout_with_the_benchs_grade(tok, tmp_path):
    [jsonl] = SWESuite().materialize(tmp_path / "suite")
    tasks = load_bench_tasks("swe", jsonl, [])
    env = BenchEnv("swe", max_turns=2, cache_dir=tmp_path / "cache")
    cfg = RLConfig(group_size=2, max_new_tokens=8, max_turns=2, concurrency=2)
    server = InProcessServer(peaky_model(), tok, 4096, 2)
    got = []
    try:
        orch = Orchestrator(env, tasks, server, tok, cfg, tmp_path / "sessions", got.append, max_model_len=4096)
        orch.run_groups([0])
        orch.close()
    finally:
        server.close()
    assert sorted(r.index for r in got) == [0, 1]
    for r in got:
        assert r.status == OK, r.error
        assert r.reward == 0.0 and r.solved is False  # a random tiny model does not fix the issue
        assert r.detail["status"] == "unresolved" and r.detail["tests"]  # graded: each test has a status
        assert r.calls and all(c.version_start == 0 for c in r.calls)
        s = r.samples[0]
        c = r.calls[0]
        assert s.ids[c.offset : c.offset + len(c.output_ids)] == c.output_ids
        # the prompt is glm5 code's: its system prompt and tools rendered by our chat format
        assert "<|system|>" in tok.decode(c.prompt_ids[:40]) and "# Tools" in tok.decode(c.prompt_ids)


def test_an_infra_error_is_an_environment_failure(tok, tmp_path):
    [jsonl] = SWESuite().materialize(tmp_path / "suite")
    tasks = load_bench_tasks("swe", jsonl, [])
    broken = [type(t)(**{**t.__dict__, "repo": str(tmp_path / "no-such-repo")}) for t in tasks[:1]]
    env = BenchEnv("swe", max_turns=1, cache_dir=tmp_path / "cache")
    cfg = RLConfig(group_size=2, max_new_tokens=4, max_turns=1, concurrency=2)
    server = InProcessServer(peaky_model(), tok, 4096, 2)
    got = []
    try:
        orch = Orchestrator(env, broken, server, tok, cfg, tmp_path / "s", got.append, max_model_len=4096)
        orch.run_groups([0])
        orch.close()
    finally:
        server.close()
    assert [r.status for r in got] == [ENV_ERROR, ENV_ERROR] and all(r.reward is None for r in got)
    assert all(r.error for r in got)
