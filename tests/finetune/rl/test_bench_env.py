"""The bench as the RL environment (finetune/rl/bench_env.py) on the built-in SWE suite: a session is a bench
trial (its own clone of the task's repository, `glm5 code`'s agent loop and tools on the session's model, the
diff graded by the bench), its model calls are recorded token in, token out, and the rollout gets the bench's
verdict; an infra error is an environment failure, never a 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.bench.trial import TrialResult
from finetune.rl.bench_env import BenchEnv, BenchSession, load_bench_tasks
from finetune.rl.config import RLConfig
from finetune.rl.orchestrator import Orchestrator
from finetune.rl.rollout import ENV_ERROR, OK
from finetune.rl.server import Generated, InProcessServer
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


class ScriptedServer:
    """A rollout server that writes a fixed reply per call (the fake is the model, which is outside the product):
    the agent's ids still go through TITO, our parser, `glm5 code`'s tools and the bench's grading."""

    def __init__(self, tok, replies: list[str]):
        self.tok, self.replies, self.calls = tok, replies, 0
        self.version = 0

    def generate(self, prompt_ids, params, session=""):
        text = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        ids = self.tok.encode(text)
        return Generated(ids, [-0.5] * len(ids), 0, 0, "stop")

    def stats(self):
        return {"idle_s": 0.0, "generated_tokens": 0}

    def close(self):
        pass


# configlite-1: "on"/"off" (any case) must parse as booleans; FAIL_TO_PASS is on-True, OFF-False, On-True. The
# scripted fix adds "on" only, so two of the three pass (and every PASS_TO_PASS test still passes).
HALF_FIX = [
    "</think>Add on.<tool_call>bash<arg_key>command</arg_key><arg_value>sed -i "
    '\'s/"yes", "1"/"yes", "on", "1"/\' configlite/values.py</arg_value></tool_call><|observation|>',
    "</think>Done.<|user|>",
]


@pytest.mark.slow
def test_partial_credit_is_the_fraction_of_fail_to_pass_tests_the_bench_saw_pass(tok, tmp_path):
    [jsonl] = SWESuite().materialize(tmp_path / "suite")
    [task] = [t for t in load_bench_tasks("swe", jsonl, []) if t.instance_id.endswith("__configlite-1")]
    env = BenchEnv("swe", max_turns=3, partial_credit=True, cache_dir=tmp_path / "cache")
    cfg = RLConfig(group_size=2, max_new_tokens=64, max_turns=3, concurrency=1, partial_credit=True)
    orch = Orchestrator(env, [task], ScriptedServer(tok, HALF_FIX), tok, cfg, tmp_path / "s", lambda r: None)
    try:
        r = orch.run_session(0, 0)
    finally:
        orch.close()
    assert r.status == OK, r.error
    assert len(r.calls) == 2  # the fix, then the submission: both calls recorded token in, token out
    tests = r.detail["tests"]
    assert [tests.get(t) for t in task.FAIL_TO_PASS] == ["PASSED", "FAILED", "PASSED"], tests  # the bench's verdicts
    assert r.detail["status"] == "unresolved" and r.solved is False
    assert r.reward == pytest.approx(2 / 3)
    # The same trial without the flag (graded from the bench's report.json, not run again): unresolved is 0.
    plain = BenchSession(BenchEnv("swe", partial_credit=False, cache_dir=tmp_path / "cache"), task, tmp_path / "p")
    plain.result = TrialResult.from_dict(json.loads((Path(r.detail["trial_dir"]) / "report.json").read_text()))
    g = plain.grade()
    assert (g.reward, g.solved, g.status) == (0.0, False, OK)


def test_an_rl_session_sees_what_a_bench_trial_sees(outside_tmp):
    # issue 40, item 2: a session could list the other sessions, read an earlier one's graded test output, the
    # held-out tasks file, and the repository cache's later history (the upstream fix) through `git log --all`
    import subprocess

    from agent.bench.agents import make_agent
    from agent.bench.trial import run_trial
    from agent.sandbox import probe
    from tests.agent.bench.conftest import CALC_FIX, TEST_MUL, calc_row, sh

    if probe(False) is not None:
        pytest.skip("bubblewrap cannot run here")
    repo = outside_tmp / "src" / "calc"
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    sh(repo, "config", "user.email", "t@example.com")
    sh(repo, "config", "user.name", "Test")
    (repo / "calc.py").write_text(CALC_FIX.replace("a + b", "a - b"))
    (repo / "test_mul.py").write_text(TEST_MUL)
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "-m", "init")
    row = calc_row(repo)
    (repo / "calc.py").write_text(CALC_FIX)
    sh(repo, "commit", "-qam", "upstream fix of add")  # later history: the answer
    tasks_file, eval_file = outside_tmp / "train.jsonl", outside_tmp / "held.jsonl"
    tasks_file.write_text(json.dumps(row) + "\n")
    eval_file.write_text(json.dumps({**row, "instance_id": "acme__calc-9"}) + "\n")
    tasks, held = load_bench_tasks("swe", tasks_file, []), load_bench_tasks("swe", eval_file, [])
    run = outside_tmp / ".out.partial"
    earlier = run / "sessions" / "g0-s0"
    earlier.mkdir(parents=True)
    (earlier / "test_output.txt").write_text("HIDDEN TEST OUTPUT\n")
    env = BenchEnv("swe", max_turns=1, cache_dir=outside_tmp / "cache")
    env.isolate([run, outside_tmp / "out"], [*tasks, *held])
    cmd = (f"ls -A {run}/sessions > /logs/agent/ls.txt 2>&1; cat {earlier}/test_output.txt > /logs/agent/prev.txt; "
           f"cat {eval_file} {tasks_file} > /logs/agent/tasks.txt; ls -A {outside_tmp}/cache > /logs/agent/cache.txt; "
           "git log --all --format=%s > /logs/agent/log.txt 2>&1; git status --short > /logs/agent/st.txt 2>&1; "
           "echo ok > /logs/agent/done.txt")  # fmt: skip
    workdir = run / "sessions" / "g0-s1"
    r = run_trial(tasks[0], make_agent(f"cmd:{cmd}"), workdir, env.trial_config(workdir))
    logs = workdir / "work" / "logs" / "agent"
    assert (logs / "done.txt").read_text() == "ok\n", r.reason
    assert "HIDDEN" not in (logs / "prev.txt").read_text()
    assert "g0-s0" not in (logs / "ls.txt").read_text()
    assert (logs / "tasks.txt").read_text() == "" and (logs / "cache.txt").read_text() == ""
    assert "upstream fix" not in (logs / "log.txt").read_text()
    # the clone is the trial's own, base history only: git works inside (the cache it was cloned from is hidden)
    assert (logs / "log.txt").read_text() == "init\n" and (logs / "st.txt").read_text() == ""
    ok = run_trial(tasks[0], make_agent("oracle"), run / "sessions" / "g1-s0", env.trial_config(run / "sessions" / "x"))
    assert ok.status == "resolved", ok.reason  # the grading still works behind the hidden set
