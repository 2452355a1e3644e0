"""One trial end to end with each agent: oracle, nop, cmd, and glm5 against a scripted endpoint."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from agent.bench.agents import AgentLimits, make_agent
from agent.bench.repos import RepoCache
from agent.bench.tasks import load_swe_tasks, load_terminal_task
from agent.bench.trial import TrialConfig, run_trial
from agent.sandbox import probe
from agent.trajectory import Trajectory
from tests.agent.fake_model import reply

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")


def config(tmp_path, **kw):
    return TrialConfig(cache_dir=tmp_path / "cache", repos=RepoCache(tmp_path / "cache"), **kw)


def test_oracle_resolves_nop_does_not(tmp_path, calc_tasks):
    task = load_swe_tasks(calc_tasks)[0]
    r = run_trial(task, make_agent("oracle"), tmp_path / "t" / "o", config(tmp_path))
    assert r.status == "resolved" and r.resolved is True and r.reward == 1.0, r.reason
    folder = tmp_path / "t" / "o"
    assert "+    return a + b" in (folder / "patch.diff").read_text()
    assert "PASSED test_add.py::test_add" in (folder / "test_output.txt").read_text()
    assert json.loads((folder / "report.json").read_text())["tests"] == r.tests
    assert not (folder / "work" / "app").exists()  # checkouts are removed, logs kept
    n = run_trial(task, make_agent("nop"), tmp_path / "t" / "n", config(tmp_path))
    assert n.status == "unresolved" and n.failing_tests == ["test_add.py::test_add"]
    labels = Trajectory.load(tmp_path / "t" / "n" / "trajectory.jsonl").outcome()
    assert labels["resolved"] is False and labels["tests_status"]["test_add.py::test_add"] == "FAILED"


def test_cmd_agent_gets_the_task_on_stdin_and_in_env(tmp_path, calc_tasks):
    task = load_swe_tasks(calc_tasks)[0]
    cmd = "cat > /logs/agent/stdin.txt; printf %s \"$GLM5_TASK\" > /logs/agent/env.txt; sed -i 's/a - b/a + b/' calc.py"
    r = run_trial(task, make_agent(f"cmd:{cmd}"), tmp_path / "c", config(tmp_path))
    assert r.resolved is True, r.reason
    logs = tmp_path / "c" / "work" / "logs" / "agent"
    assert "add(2, 3) returns -1" in (logs / "stdin.txt").read_text()
    assert (logs / "stdin.txt").read_text().strip() == (logs / "env.txt").read_text().strip()


def test_agent_never_sees_tests_or_gold(tmp_path, calc_tasks):
    task = load_swe_tasks(calc_tasks)[0]
    cmd = "ls -R / 2>/dev/null | grep -c test_add > /logs/agent/seen.txt; ls /tests /solution > /logs/agent/ls.txt 2>&1; true"
    run_trial(task, make_agent(f"cmd:{cmd}"), tmp_path / "c", config(tmp_path, keep_workdirs=True))
    logs = tmp_path / "c" / "work" / "logs" / "agent"
    assert "No such file" in (logs / "ls.txt").read_text()
    assert not (tmp_path / "c" / "work" / "app" / "test_add.py").exists()


def test_a_trial_cannot_read_the_task_files_the_run_folder_or_the_built_in_suites(tmp_path, calc_tasks):
    # the rest of the filesystem is readable inside; the gold patch is in the tasks file, other trials and the
    # repository cache (later history) in the run folder, every built-in task's gold in the suites' data
    import plugins.bench_suites

    run = tmp_path / "run"
    suites = Path(plugins.bench_suites.__file__).parent
    task = load_swe_tasks(calc_tasks)[0]
    cmd = (f"cat {calc_tasks} > /logs/agent/tasks.txt; ls -A {run} > /logs/agent/run.txt; "
           f"ls {suites} > /logs/agent/suites.txt; echo ok > /logs/agent/done.txt")  # fmt: skip
    cfg = config(tmp_path, keep_workdirs=True, hide=(run,))
    r = run_trial(task, make_agent(f"cmd:{cmd}"), run / "trials" / "c" / "0", cfg)
    logs = run / "trials" / "c" / "0" / "work" / "logs" / "agent"
    assert (logs / "done.txt").read_text() == "ok\n", r.reason
    assert (logs / "tasks.txt").read_text() == "" and "FAIL_TO_PASS" in calc_tasks.read_text()
    assert (logs / "run.txt").read_text() in ("", "trials\n") and (logs / "suites.txt").read_text() == ""
    ok = run_trial(task, make_agent("oracle"), run / "trials" / "o" / "0", cfg)
    assert ok.status == "resolved", ok.reason


def test_infra_failure_is_labelled(tmp_path, calc_tasks):
    task = load_swe_tasks(calc_tasks)[0]
    broken = type(task)(**{**task.__dict__, "repo": str(tmp_path / "gone")})
    r = run_trial(broken, make_agent("oracle"), tmp_path / "x", config(tmp_path))
    assert r.status == "infra_error" and r.resolved is None and "neither a folder" in r.reason


def test_glm5_agent_fixes_the_bug_through_its_tools(tmp_path, calc_tasks, fake_model):
    fake_model.script = [
        reply("Looking.", tools=[("read", {"path": "calc.py"})]),
        reply(
            "Fixing.", tools=[("edit", {"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"})]
        ),
        reply("Checking.", tools=[("bash", {"command": "pwd && python -c 'from calc import add; print(add(2, 3))'"})]),
        reply("Fixed add()."),
    ]
    task = load_swe_tasks(calc_tasks)[0]
    agent = make_agent("glm5", base_url=fake_model.base_url, model="fake-glm", extra_body={"logprobs": True})
    r = run_trial(task, agent, tmp_path / "g", config(tmp_path, limits=AgentLimits(max_turns=8)))
    assert r.status == "resolved", r.reason
    assert r.exit_status == "submitted" and r.steps == 4 and r.prompt_tokens == 400
    traj = Trajectory.load(tmp_path / "g" / "trajectory.jsonl")
    tool_results = [rec["result"] for rec in traj.records if rec.get("type") == "tool"]
    assert "/app\n5" in tool_results[2]  # bash ran in the trial's /app
    labels = traj.outcome()
    assert labels["reward"] == 1.0 and labels["resolved"] is True
    assert labels["tests_status"] == {"test_add.py::test_add": "PASSED", "test_mul.py::test_mul": "PASSED"}
    assert any(s["logprobs"] for s in traj.samples())  # training-ready: the server's logprobs kept
    # the agent saw the issue, never the tests or the fix
    first = fake_model.requests[0]["messages"]
    assert "add(2, 3) returns -1" in first[-1]["content"] and "test_add" not in json.dumps(first)


def test_terminal_task_oracle_and_nop(tmp_path):
    t = tmp_path / "hello"
    (t / "environment").mkdir(parents=True)
    (t / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app/\n")
    (t / "environment" / "seed.txt").write_text("seed\n")
    (t / "tests").mkdir()
    (t / "tests" / "test.sh").write_text(
        '#!/bin/bash\nif [ "$(cat /app/hello.txt)" = hello ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
    )
    (t / "solution").mkdir()
    (t / "solution" / "solve.sh").write_text("echo hello > /app/hello.txt\n")
    (t / "instruction.md").write_text("Write hello to /app/hello.txt\n")
    (t / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 30\n')
    task = load_terminal_task(t)
    o = run_trial(task, make_agent("oracle"), tmp_path / "o", config(tmp_path))
    assert o.status == "resolved" and o.reward == 1.0, o.reason
    n = run_trial(task, make_agent("nop"), tmp_path / "n", config(tmp_path))
    assert n.status == "unresolved" and n.reward == 0.0
    (t / "tests" / "test.sh").write_text("exit 3\n")  # a verifier that writes no reward: never a zero
    e = run_trial(load_terminal_task(t), make_agent("oracle"), tmp_path / "e", config(tmp_path))
    assert e.status == "infra_error" and "no /logs/verifier/reward.txt" in e.reason


def test_endpoint_down_is_an_infra_error_not_a_failure(tmp_path, calc_tasks):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    task = load_swe_tasks(calc_tasks)[0]
    agent = make_agent("glm5", base_url=f"http://127.0.0.1:{port}/v1", model="m")
    r = run_trial(task, agent, tmp_path / "d", config(tmp_path))
    assert r.status == "infra_error" and r.resolved is None and "model endpoint error" in r.reason


def test_glm5_agent_on_a_terminal_task_works_in_app(tmp_path, fake_model):
    t = tmp_path / "task"
    (t / "environment").mkdir(parents=True)
    (t / "environment" / "names.txt").write_text("b\na\n")
    (t / "tests").mkdir()
    (t / "tests" / "test.sh").write_text(
        'if [ "$(cat /app/sorted.txt)" = "$(printf "a\\nb")" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
    )
    (t / "instruction.md").write_text("Sort /app/names.txt into /app/sorted.txt\n")
    fake_model.script = [
        reply("", tools=[("bash", {"command": "sort /app/names.txt > /app/sorted.txt && pwd"})]),
        reply("Done."),
    ]
    agent = make_agent("glm5", base_url=fake_model.base_url, model="fake", api_key="k-123")
    r = run_trial(load_terminal_task(t), agent, tmp_path / "g", config(tmp_path))
    assert r.status == "resolved" and r.reward == 1.0, r.reason
    assert fake_model.requests  # it went through the scripted endpoint, with the key given
    assert "k-123" not in (tmp_path / "g" / "trajectory.jsonl").read_text()


def _terminal_task(root, toml=""):
    t = root / "task"
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "tests" / "test.sh").write_text(
        '[ "$(cat out.txt)" = ok ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'
    )
    (t / "instruction.md").write_text("Write ok to out.txt in your working folder.\n")
    (t / "task.toml").write_text('schema_version = "1.4"\n' + toml)
    return load_terminal_task(t)


def test_a_task_workdir_other_than_app_is_the_same_folder(tmp_path):
    task = _terminal_task(tmp_path, '[environment]\nworkdir = "/workspace"\n')
    agent = make_agent("cmd:pwd > /logs/agent/pwd && echo ok > /workspace/out.txt")
    r = run_trial(task, agent, tmp_path / "w", config(tmp_path))
    assert r.status == "resolved", r.reason


def test_glm5_agent_with_an_in_process_client(tmp_path):
    """The RL orchestrator's way in: the agent loop with a model object instead of an HTTP endpoint."""
    import threading

    from agent.bench.agents import Glm5Agent
    from agent.client import ModelResponse

    class Scripted:
        cancel_event = threading.Event()
        failure = None

        def __init__(self):
            self.replies = [[{"id": "c1", "type": "function",
                              "function": {"name": "bash", "arguments": '{"command": "echo ok > out.txt"}'}}], []]  # fmt: skip

        def query(self, messages, tools=None, on_delta=None):
            calls = self.replies.pop(0)
            raw = {"choices": [{"message": {"role": "assistant", "content": "done", "tool_calls": calls or None}}]}
            return ModelResponse("done" if not calls else "", None, calls, "tool_calls" if calls else "stop",
                                 {"prompt_tokens": 7, "completion_tokens": 3}, raw)  # fmt: skip

    r = run_trial(_terminal_task(tmp_path), Glm5Agent(client=Scripted()), tmp_path / "g", config(tmp_path))
    assert r.status == "resolved" and r.steps == 2 and r.prompt_tokens == 14, r.reason


def test_a_seeded_glm5_agent_sends_each_attempts_own_seeds_the_same_on_a_rerun(tmp_path, calc_tasks, fake_model):
    from agent.bench.agents import trial_seed

    task = load_swe_tasks(calc_tasks)[0]
    seeds: dict[str, list[int]] = {}
    for name, seed, attempt in (("a0", 5, 0), ("a0-again", 5, 0), ("a1", 5, 1), ("other", 6, 0), ("none", None, 0)):
        fake_model.script = [reply("Looking.", tools=[("read", {"path": "calc.py"})]), reply("Done.")]
        fake_model.requests.clear()
        agent = make_agent("glm5", base_url=fake_model.base_url, model="fake-glm", seed=seed)
        run_trial(task, agent, tmp_path / name, config(tmp_path, limits=AgentLimits(max_turns=4)), attempt)
        seeds[name] = [r.get("seed") for r in fake_model.requests]
        assert ("seed" in agent.describe()) == (seed is not None)  # config.json: an unseeded run is as before
    first = trial_seed(5, task.task_id, 0)
    assert seeds["a0"] == seeds["a0-again"] == [first, first + 1]  # the session's n-th request: seed + n
    assert seeds["a1"][0] != first and seeds["other"][0] != first and seeds["a1"][1] == seeds["a1"][0] + 1
    assert seeds["none"] == [None, None]  # unseeded: the server draws its own


def test_a_seed_in_the_users_config_seeds_each_attempt_apart(tmp_path, calc_tasks, fake_model, isolated_config):
    (isolated_config / "config.toml").write_text("[agent]\nseed = 9\n")
    task = load_swe_tasks(calc_tasks)[0]
    first = []
    for attempt in (0, 1):
        fake_model.script = [reply("Done.")]
        fake_model.requests.clear()
        agent = make_agent("glm5", base_url=fake_model.base_url, model="fake-glm")
        run_trial(task, agent, tmp_path / str(attempt), config(tmp_path, limits=AgentLimits(max_turns=2)), attempt)
        first.append(fake_model.requests[0]["seed"])
        assert agent.describe()["seed"] == 9
    from agent.bench.agents import trial_seed

    assert first == [trial_seed(9, task.task_id, 0), trial_seed(9, task.task_id, 1)]  # never one seed for all k


def test_every_trial_shows_the_model_app_so_a_seeded_bench_sends_the_same_requests_in_any_folder(
    tmp_path, calc_tasks, fake_model
):
    """The system prompt names /app (where commands run), not the trial's host folder, and the task's date, not
    today's: two runs of one seeded attempt in different output folders send identical requests, and no host path
    reaches the model. The file tools take /app/... as the trial's folder; /app/../ is no way out."""
    import datetime

    from agent.bench.agents import task_date

    task = load_swe_tasks(calc_tasks)[0]
    assert task_date(task) == "unknown" or re.fullmatch(r"\d{4}-\d{2}-\d{2}", task_date(task))
    assert task_date(dataclasses.replace(task, extra={"created_at": "2023-05-01T10:00:00Z"})) == "2023-05-01"
    assert task_date(dataclasses.replace(task, extra={"created_at": "yesterday"})) == "unknown"
    sent = {}
    for name in ("run-a", "elsewhere/run-b"):
        fake_model.script = [
            reply("", tools=[("read", {"path": "/app/calc.py"})]),
            reply("", tools=[("read", {"path": "/app/../etc/hostname"})]),
            reply("", tools=[("edit", {"path": "/app/calc.py", "old_string": "a - b", "new_string": "a + b"})]),
            reply("Fixed."),
        ]
        fake_model.requests.clear()
        agent = make_agent("glm5", base_url=fake_model.base_url, model="fake-glm", seed=3)
        r = run_trial(task, agent, tmp_path / name, config(tmp_path, limits=AgentLimits(max_turns=6)))
        assert r.status == "resolved", r.reason
        sent[name] = [{k: v for k, v in q.items() if k != "stream_options"} for q in fake_model.requests]
        text = json.dumps(fake_model.requests)
        assert str(tmp_path) not in text and "Working folder: /app" in text
        assert f"Date: {task_date(task)}." in text and task_date(task) != datetime.date.today().isoformat()
        results = [
            rec for rec in Trajectory.load(tmp_path / name / "trajectory.jsonl").records if rec["type"] == "tool"
        ]
        assert "def add" in results[0]["result"]  # /app/calc.py is the trial's calc.py
        assert results[1]["is_error"] or results[1].get("decision") in ("denied", "blocked")  # outside: refused
    assert sent["run-a"] == sent["elsewhere/run-b"]


def _silent_task(root):
    """A terminal task whose verifier writes a reward only when the work is done (else nothing: an infra error)."""
    t = root / "task"
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "tests" / "test.sh").write_text('[ "$(cat out.txt)" = ok ] && echo 1 > /logs/verifier/reward.txt\ntrue\n')
    (t / "instruction.md").write_text("Write ok to out.txt.\n")
    (t / "task.toml").write_text('schema_version = "1.4"\n')
    return load_terminal_task(t)


def test_an_agent_cannot_write_its_own_reward(tmp_path):
    # the verifier runs where the agent worked (Harbor's default) and /logs/verifier is writable to both: what the
    # agent leaves there (a reward.json, a reward.txt folder that stops the verifier's own write, a link to a host
    # file the sandbox hides) is cleared before the verifier runs, and only regular files are read
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-42\n")
    task = _silent_task(tmp_path)
    for i, cmd in enumerate((
        'mkdir -p /logs/verifier/reward.txt; echo \'{"reward": 1}\' > /logs/verifier/reward.json',
        f"ln -s {secret} /logs/verifier/reward.txt",
        "echo 1 > /logs/verifier/reward.txt; echo '{\"results\": {\"tests\": []}}' > /logs/verifier/ctrf.json",
    )):  # fmt: skip
        r = run_trial(task, make_agent(f"cmd:{cmd}"), tmp_path / f"t{i}", config(tmp_path))
        assert r.status == "infra_error" and r.resolved is None, (cmd, r.status, r.reason)
        assert "HOST-SECRET" not in json.dumps(dataclasses.asdict(r))
    ok = run_trial(task, make_agent("cmd:echo ok > out.txt"), tmp_path / "ok", config(tmp_path))
    assert ok.status == "resolved", ok.reason


def test_host_git_never_follows_a_terminal_agents_git_elsewhere(tmp_path):
    # a terminal task's /app/.git is the agent's: a `gitdir:` file naming a host repository would have host git
    # write the agent's files into it; core.worktree naming a host folder would diff files the sandbox hides
    import os
    import subprocess

    victim = tmp_path / "victim"
    subprocess.run(["git", "init", "-q", str(victim)], check=True)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "creds.txt").write_text("HIDDEN-CREDS\n")
    task = _silent_task(tmp_path)
    objects = lambda: sum(len(fs) for _, _, fs in os.walk(victim / ".git" / "objects"))  # noqa: E731
    before = objects()
    r = run_trial(task, make_agent(f'cmd:echo "gitdir: {victim}/.git" > .git; echo planted > p.txt'),
                  tmp_path / "a", config(tmp_path))  # fmt: skip
    assert objects() == before and r.status != "resolved"
    cmd = (f"git init -q && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x && "
           f"git config core.worktree {hidden} && echo mine > mine.txt")  # fmt: skip
    r = run_trial(task, make_agent(f"cmd:{cmd}"), tmp_path / "b", config(tmp_path))
    patch = (tmp_path / "b" / "patch.diff").read_text()
    assert "HIDDEN-CREDS" not in patch and "+mine" in patch


def test_a_task_file_narrows_but_never_widens_the_users_limits(tmp_path, monkeypatch):
    # issue 40, item 3: task.toml's allow_internet turned the network on and its memory_mb raised the user's cap
    from agent.bench.trial import env_spec

    monkeypatch.delenv("GLM5_BENCH_TASK_NETWORK", raising=False)
    t = tmp_path / "net"
    (t / "tests").mkdir(parents=True)
    (t / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (t / "instruction.md").write_text("x\n")
    (t / "task.toml").write_text("[environment]\nallow_internet = true\nmemory_mb = 100000\n")
    task = load_terminal_task(t)
    spec = env_spec(task, tmp_path / "w", config(tmp_path, limits=AgentLimits(memory_mb=2048)))
    assert spec.network is False and spec.memory_mb == 2048
    (t / "task.toml").write_text("[environment]\nallow_internet = true\nmemory_mb = 512\n")
    task = load_terminal_task(t)
    assert env_spec(task, tmp_path / "w", config(tmp_path, limits=AgentLimits(memory_mb=2048))).memory_mb == 512
    monkeypatch.setenv("GLM5_BENCH_TASK_NETWORK", "1")  # the user's own choice
    assert env_spec(task, tmp_path / "w", config(tmp_path)).network is True
    r = run_trial(task, make_agent("nop"), tmp_path / "n", config(tmp_path, task_network=False))
    assert "stayed off" in r.reason
