"""The orchestrator (finetune/rl/orchestrator.py) with fakes of its neighbours (a scripted rollout server, a fake
environment): sessions of a group run at once, each model call carries the server's weight version, an environment
that fails gives an ENV_ERROR rollout, the server failing stops the run, the gate holds groups back, and done
samples are skipped."""

from __future__ import annotations

import threading
import time

import pytest

from finetune.rl.config import RLConfig
from finetune.rl.orchestrator import Orchestrator
from finetune.rl.rollout import ENV_ERROR, OK, Grade
from finetune.rl.server import Generated


class Server:
    def __init__(self, tok, version=7, fail=False):
        self.tok, self.version, self.fail = tok, version, fail
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def generate(self, prompt_ids, params, session=""):
        if self.fail:
            raise RuntimeError("engine died")
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.05)  # long enough for the others to arrive: they are in flight together
        with self.lock:
            self.active -= 1
        ids = self.tok.encode("7</think>seven<|user|>")
        return Generated(ids, [-0.5] * len(ids), self.version, self.version, "stop")


class Env:
    name = "fake"

    def __init__(self, crash_at=None):
        self.crash_at = crash_at

    def reset(self, task, workdir, sample=0):
        env = self

        class Session:
            def run(self, model):
                if env.crash_at == ("run", sample):
                    raise OSError("sandbox vanished")
                self.reply = model.query([{"role": "user", "content": task}]).content

            def grade(self):
                if env.crash_at == ("grade", sample):
                    return Grade(None, None, ENV_ERROR, "verifier wrote nothing")
                return Grade(1.0 if "seven" in self.reply else 0.0, True)

            def close(self):
                pass

        return Session()


def make(tok, tmp_path, env=None, server=None, **kw):
    got = []
    cfg = RLConfig(group_size=4, concurrency=8, max_new_tokens=8)
    orch = Orchestrator(env or Env(), ["t0", "t1", "t2"], server or Server(tok), tok, cfg, tmp_path, got.append, **kw)
    return orch, got


def test_a_groups_sessions_run_at_once_and_record_versions(tok, tmp_path):
    server = Server(tok)
    orch, got = make(tok, tmp_path, server=server)
    orch.run_groups([0, 1])
    orch.close()
    assert sorted((r.group, r.index) for r in got) == [(g, i) for g in (0, 1) for i in range(4)]
    assert server.peak > 1  # concurrent
    assert all(r.status == OK and r.reward == 1.0 and r.calls[0].version_start == 7 for r in got)
    assert all(r.oldest_version == 7 and r.samples[0].version == 7 for r in got)
    assert len({r.task for r in got if r.group == 0}) == 1  # one task per group


@pytest.mark.parametrize("where", ["run", "grade"])
def test_an_environment_failure_is_an_env_error_rollout(tok, tmp_path, where):
    orch, got = make(tok, tmp_path, env=Env(crash_at=(where, 2)))
    orch.run_groups([0])
    orch.close()
    bad = [r for r in got if r.status != OK]
    assert [r.index for r in bad] == [2] and bad[0].status == ENV_ERROR and bad[0].reward is None
    assert ("sandbox vanished" if where == "run" else "verifier wrote nothing") in bad[0].error


def test_the_rollout_server_failing_stops_the_run(tok, tmp_path):
    orch, got = make(tok, tmp_path, server=Server(tok, fail=True))
    with pytest.raises(RuntimeError, match="engine died"):
        orch.run_groups([0])
    orch.close()
    assert got == []


def test_the_gate_holds_groups_back_and_done_samples_are_skipped(tok, tmp_path):
    done = {(0, 1), (0, 3)}
    orch, got = make(tok, tmp_path, skip=lambda g, i: (g, i) in done, skip_group=lambda g: g == 1)
    allowed = [1]
    changed = threading.Condition()
    orch.start(lambda g: orch.started < allowed[0], changed)
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert sorted((r.group, r.index) for r in got) == [(0, 0), (0, 2)]  # group 0 only, its done samples skipped
    with changed:
        allowed[0] = 2
        changed.notify_all()
    while len(got) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    orch.close()
    assert sorted({r.group for r in got}) == [0, 2]  # group 1 was done already (consumed): the next is 2


def test_a_fixed_length_session_runs_its_turns_whatever_it_answers():
    """bench_rl's long-tail workload: `lengths` fixes a session's turns (a match does not end it early), and the
    long tail is fixed by (task, sample) with the spread its docstring states."""
    from finetune.rl.scripted import ScriptedFamily, ScriptedTask, long_tail_lengths

    class Says7:
        calls = 0

        def query(self, messages, tools=None):
            from agent.client import ModelResponse

            Says7.calls += 1
            return ModelResponse(content="7", reasoning_content=None, tool_calls=[], finish_reason="stop",
                                 usage={}, raw={}, latency_s=0.0)  # fmt: skip

    task = ScriptedTask("t", "pick a digit")
    s = ScriptedFamily(turns=3, lengths=lambda name, sample: 5).reset(task, None, 0)
    s.run(Says7())
    assert Says7.calls == 5 and s.grade().reward == 1.0
    Says7.calls = 0
    ScriptedFamily(turns=3).reset(task, None, 0).run(Says7())
    assert Says7.calls == 1  # without lengths a match ends the session
    drawn = [long_tail_lengths(f"digit-{i % 8}", i) for i in range(4000)]
    assert set(drawn) == {1, 2, 4, 12} and drawn == [long_tail_lengths(f"digit-{i % 8}", i) for i in range(4000)]
    assert 2.5 < sum(drawn) / len(drawn) < 3.1 and 0.08 < drawn.count(12) / len(drawn) < 0.12
    # bench_rl's agentic workload: every tool result (between turns, not after the last) waits tool_s
    import time

    t0 = time.monotonic()
    ScriptedFamily(turns=3, lengths=lambda name, sample: 4, tool_s=0.05).reset(task, None, 0).run(Says7())
    assert time.monotonic() - t0 >= 3 * 0.05
