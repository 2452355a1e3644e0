"""`--env docker` end to end, in real containers: the built-in Harbor tasks and two SWE tasks (oracle resolves, nop
does not), a run killed mid-trial resumes and leaves no container behind, and a row as the SWE-bench harness
publishes it runs its eval script in a harness-layout image. The daemon and the base image come from
tests/agent/bench/docker_daemon.py (started and built offline where root and dockerd allow); skipped, with the
reason, only where no daemon can run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.bench import docker_daemon

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def docker():
    why = docker_daemon.daemon() or docker_daemon.base_image()
    if why:
        pytest.skip(f"no Docker here: {why}")
    # the built-in Harbor tasks start FROM python:3.12-slim; offline, the base image (Debian's Python 3.11) is it
    docker_daemon.tag(docker_daemon.BASE_IMAGE, "python:3.12-slim")
    return os.environ.get("DOCKER_HOST", "")


def glm5(*args, timeout=900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "glm5cli.app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip


def summary(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())["summary"]


def test_builtin_harbor_tasks_under_docker(docker, tmp_path):
    out = tmp_path / "oracle"
    r = glm5("bench", "terminal", "--suite", "builtin", "--env", "docker", "--agent", "oracle", "-n", "2",
             "--out", out)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    s = summary(out)
    assert s["infra_errors"] == 0 and s["resolved_rate"] == 1.0, s
    r = glm5("bench", "terminal", "--suite", "builtin", "--env", "docker", "--agent", "nop", "-n", "2",
             "--out", tmp_path / "nop")  # fmt: skip
    s = summary(tmp_path / "nop")
    assert s["infra_errors"] == 0 and s["resolved"] == 0, s
    assert docker_daemon.containers() == []


def test_two_swe_tasks_under_docker_oracle_resolves_nop_does_not(docker, tmp_path):
    flt = "ledger-1$|logtools-1$"
    r = glm5("bench", "swe", "--suite", "builtin", "--filter", flt, "--env", "docker", "--agent", "oracle",
             "--out", tmp_path / "oracle")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    s = summary(tmp_path / "oracle")
    assert s["resolved"] == 2 and s["infra_errors"] == 0, s
    glm5("bench", "swe", "--suite", "builtin", "--filter", flt, "--env", "docker", "--agent", "nop",
         "--out", tmp_path / "nop")  # fmt: skip
    s = summary(tmp_path / "nop")
    assert s["resolved"] == 0 and s["infra_errors"] == 0, s


def test_a_run_killed_mid_trial_resumes_and_leaves_no_container(docker, tmp_path):
    out = tmp_path / "run"
    args = ["bench", "swe", "--suite", "builtin", "--filter", "ledger-[12]$", "--env", "docker", "--agent",
            "oracle", "--out", out]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "glm5cli.app", *map(str, args)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not docker_daemon.containers():
        time.sleep(0.2)
    assert docker_daemon.containers(), "no trial container started"
    os.killpg(proc.pid, signal.SIGKILL)  # as a CI job cancelled: no cleanup at all
    proc.wait()
    r = glm5(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    s = summary(out)
    assert s["resolved"] == 2 and s["infra_errors"] == 0, s
    assert docker_daemon.containers() == []  # the killed trial's container went with its retry


HARNESS_DOCKERFILE = """FROM {base}
RUN mkdir -p /opt/miniconda3/bin && printf 'conda() {{ :; }}\\n' > /opt/miniconda3/bin/activate
COPY repo /testbed
RUN cd /testbed && git config --global user.email setup@swebench.config && git config --global user.name SWE-bench \\
    && git commit --allow-empty -qm SWE-bench
WORKDIR /testbed
"""


def test_a_published_row_runs_the_harness_eval_script_in_its_image(docker, tmp_path, calc_repo):
    """An image laid out as the harness's are (the repository at /testbed, a `testbed` conda env to activate: here
    an empty one), named as the harness names it; the row carries only the harness's fields."""
    pytest.importorskip("swebench", reason="the harness's parsers are the swebench extra")
    from tests.agent.bench.conftest import calc_row, sh

    row = calc_row(calc_repo, "acme__calc-7")
    ctx = tmp_path / "ctx"
    sh(calc_repo, "clone", "-q", str(calc_repo), str(ctx / "repo"))
    (ctx / "Dockerfile").write_text(HARNESS_DOCKERFILE.format(base=docker_daemon.BASE_IMAGE))
    from agent.bench.harness_specs import image_name

    image = image_name(row["instance_id"])
    subprocess.run(["docker", "build", "-q", "-t", image, str(ctx)], check=True, capture_output=True,
                   env={**os.environ})  # fmt: skip
    base = row["base_commit"]
    script = (f"#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\nconda activate testbed\n"
              f"cd /testbed\ngit checkout {base} test_add.py test_mul.py\n"
              f"git apply -v - <<'EOF_1'\n{row['test_patch']}\nEOF_1\n: '>>>>> Start Test Output'\n"
              "python -m pytest -rA -p no:cacheprovider test_add.py test_mul.py\n: '>>>>> End Test Output'\n"
              f"git checkout {base} test_add.py test_mul.py\n")  # fmt: skip
    published = {k: row[k] for k in ("instance_id", "base_commit", "problem_statement", "patch", "test_patch",
                                     "FAIL_TO_PASS", "PASS_TO_PASS", "version")}  # fmt: skip
    published.update(repo="acme/calc", eval_script=script, log_parser="parse_log_pytest", eval_type="pass_and_fail")
    tasks = tmp_path / "published.jsonl"
    tasks.write_text(json.dumps(published) + "\n")
    for agent, resolved in (("oracle", 1), ("nop", 0)):
        out = tmp_path / agent
        r = glm5("bench", "swe", tasks, "--env", "docker", "--agent", agent, "--out", out)
        assert r.returncode == 0, r.stdout + r.stderr
        s = summary(out)
        log = (out / "trials" / "acme__calc-7" / "0" / "test_output.txt").read_text()
        assert s["resolved"] == resolved and s["infra_errors"] == 0, (s, log)
        assert "bash /logs/verifier/eval.sh" in log and ">>>>> Test Exit Code" in log


def test_commands_wrapped_for_the_agent_reach_the_daemon_without_its_environment(docker, tmp_path):
    """The glm5 agent's tools run `wrap`ped argv with a scrubbed environment (no DOCKER_HOST): the argv names the
    daemon itself."""
    from agent.bench.docker_env import BASE_IMAGE, DockerEnvironment
    from agent.bench.environments import EnvSpec

    env = DockerEnvironment(EnvSpec(tmp_path / "t", image=BASE_IMAGE, app_source=lambda d: d.mkdir(parents=True)))
    env.start()
    try:
        r = subprocess.run(env.wrap(["bash", "-c", "pwd"]), capture_output=True, text=True, timeout=60,
                           env={"PATH": os.environ["PATH"]})  # fmt: skip
        assert r.returncode == 0 and r.stdout.strip() == "/app", r.stderr
    finally:
        env.stop()


def _toolchain_image_built() -> bool:
    """Whether the multilingual suite's image (built from its Dockerfile, tagged by its digest) is already there."""
    import hashlib

    from plugins.bench_suites.multilingual_suite import DATA

    # DockerEnvironment tags a build by the digest of its context, which holds only the Dockerfile
    tag = "glm5-bench:" + hashlib.sha256((DATA / "Dockerfile").read_bytes()).hexdigest()[:16]
    r = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, env={**os.environ})
    return r.returncode == 0 and os.environ.get("GLM5_TEST_TOOLCHAINS") != "0"


def test_multilingual_tasks_under_docker(docker, tmp_path):
    """Go, Rust, JavaScript, C, PHP, Ruby and Java, each graded with the harness's parser for it: the gold patch resolves, no
    patch does not. The toolchains' image builds from the rows' Dockerfile (Debian packages, about 600 MB to
    download and 3.5 minutes on 2 cores) once: a run sets GLM5_TEST_TOOLCHAINS=1 to build it."""
    if os.environ.get("GLM5_TEST_TOOLCHAINS") != "1" and not _toolchain_image_built():
        pytest.skip("the toolchains' image is not built; GLM5_TEST_TOOLCHAINS=1 builds it (3.5 min, 600 MB)")
    for agent, resolved in (("oracle", 7), ("nop", 0)):
        out = tmp_path / agent
        r = glm5("bench", "swe", "--suite", "multilingual", "--env", "docker", "--agent", agent, "--out", out,
                 timeout=1800)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        s = summary(out)
        reasons = [json.loads(x)["reason"] for x in (out / "results.jsonl").read_text().splitlines()]
        assert s["resolved"] == resolved and s["infra_errors"] == 0, (s, reasons)


def test_a_tasks_setup_runs_in_its_container_then_the_network_is_cut(docker, tmp_path, calc_repo):
    from agent.bench.docker_env import BASE_IMAGE, DockerEnvironment
    from agent.bench.environments import EnvSpec
    from agent.bench.repos import RepoCache, working_tree_diff
    from tests.agent.bench.conftest import calc_row

    row = calc_row(calc_repo)
    repos = RepoCache(tmp_path / "cache")
    setup = "ls /sys/class/net > /logs/agent/nets-at-setup && echo 'K = 2' > gen_const.py"
    env = DockerEnvironment(EnvSpec(tmp_path / "t", image=BASE_IMAGE, setup=setup,
                                    app_source=lambda d: repos.checkout(str(calc_repo), row["base_commit"], d)))  # fmt: skip
    env.start()
    try:
        assert "eth0" in (env.logs / "agent" / "nets-at-setup").read_text()  # online for the setup
        r = env.exec("ls /sys/class/net; python -c 'import gen_const; print(gen_const.K)'")
        assert r.output.split() == ["lo", "2"], r.output  # then cut off; the generated module is there
        assert "gen_const" not in working_tree_diff(env.app_dir, row["base_commit"])
    finally:
        env.stop()


def test_a_harness_task_repo_builds_its_image_without_the_answer(docker, tmp_path, calc_repo):
    """`glm5 bench swe TASK_REPO --env docker`: the image the row names is not here and cannot be pulled, so it is
    built from the task's Dockerfile as the harness builds it, in a context without gold.patch or test.patch."""
    pytest.importorskip("swebench", reason="reading a task repo needs the swebench extra")
    yaml = pytest.importorskip("yaml")

    from tests.agent.bench.conftest import calc_row, sh

    row = calc_row(calc_repo, "acme__calc-9")
    d = tmp_path / "taskrepo" / "tasks" / row["instance_id"]
    d.mkdir(parents=True)
    sh(calc_repo, "clone", "-q", str(calc_repo), str(d / "repo"))
    (d / "Dockerfile").write_text(HARNESS_DOCKERFILE.format(base=docker_daemon.BASE_IMAGE) + "COPY . /ctx\n")
    base = row["base_commit"]
    image = "sweb.eval.x86_64.acme__calc-9:glm5test"
    (d / "task.yaml").write_text(yaml.safe_dump({
        "instance_id": row["instance_id"], "repo": "acme/calc", "base_commit": base, "version": "1.0",
        "image": image, "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail", "split": "test"}))  # fmt: skip
    (d / "tests.json").write_text(json.dumps({"FAIL_TO_PASS": json.loads(row["FAIL_TO_PASS"]),
                                              "PASS_TO_PASS": json.loads(row["PASS_TO_PASS"])}))  # fmt: skip
    (d / "problem_statement.md").write_text(row["problem_statement"])
    (d / "gold.patch").write_text(row["patch"])
    (d / "test.patch").write_text(row["test_patch"])
    (d / "eval.sh").write_text(
        f"#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\nconda activate testbed\ncd /testbed\n"
        f"git checkout {base} test_add.py test_mul.py\ngit apply -v - <<'EOF_1'\n{row['test_patch']}\nEOF_1\n"
        ": '>>>>> Start Test Output'\npython -m pytest -rA -p no:cacheprovider test_add.py test_mul.py\n"
        f": '>>>>> End Test Output'\ngit checkout {base} test_add.py test_mul.py\n")  # fmt: skip
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True, env={**os.environ})
    for agent, resolved in (("oracle", 1), ("nop", 0)):
        out = tmp_path / agent
        r = glm5("bench", "swe", tmp_path / "taskrepo", "--env", "docker", "--agent", agent, "--out", out)
        assert r.returncode == 0, r.stdout + r.stderr
        s = summary(out)
        assert s["resolved"] == resolved and s["infra_errors"] == 0, s
    ls = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "ls", "/ctx"], capture_output=True,
                        text=True, env={**os.environ})  # fmt: skip
    assert "Dockerfile" in ls.stdout and "repo" in ls.stdout
    assert not {"gold.patch", "test.patch", "eval.sh", "tests.json"} & set(ls.stdout.split()), ls.stdout


def test_the_glm5_agent_works_through_its_tools_in_a_container(docker, tmp_path, calc_tasks, fake_model):
    """The glm5 agent's read / edit / bash reach the container (its bash through `docker exec`, run with the
    agent's scrubbed environment): it fixes the bug and the trial resolves."""
    from agent.bench.agents import AgentLimits, make_agent
    from agent.bench.tasks import load_swe_tasks
    from agent.bench.trial import TrialConfig, run_trial
    from tests.agent.fake_model import reply

    fake_model.script = [
        reply("Looking.", tools=[("read", {"path": "calc.py"})]),
        reply("Fixing.", tools=[("edit", {"path": "calc.py", "old_string": "return a - b",
                                          "new_string": "return a + b"})]),  # fmt: skip
        reply("Checking.", tools=[("bash", {"command": "cat /etc/debian_version >/dev/null && pwd && "
                                                       "python -c 'from calc import add; print(add(2, 3))'"})]),  # fmt: skip
        reply("Fixed add()."),
    ]
    task = load_swe_tasks(calc_tasks)[0]
    agent = make_agent("glm5", base_url=fake_model.base_url, model="fake-glm")
    cfg = TrialConfig(env="docker", cache_dir=tmp_path / "cache", limits=AgentLimits(max_turns=8))
    r = run_trial(task, agent, tmp_path / "g", cfg)
    assert r.status == "resolved", r.reason
    traj = (tmp_path / "g" / "trajectory.jsonl").read_text()
    assert "/app\\n5" in traj  # bash ran in the container's /app


def test_a_terminal_session_runs_on_a_terminal_in_the_container(docker, tmp_path, calc_repo):
    """The agent's terminal tools under --env docker: the program gets a terminal of its own in the container
    (docker exec -t), so `setsid -c` can make it the controlling one and a shell is interactive there."""
    from agent.bench.agents import BenchSandbox
    from agent.bench.docker_env import BASE_IMAGE, DockerEnvironment
    from agent.bench.environments import EnvSpec
    from agent.bench.repos import RepoCache
    from agent.environment import Environment
    from tests.agent.bench.conftest import calc_row

    row = calc_row(calc_repo)
    repos = RepoCache(tmp_path / "cache")
    denv = DockerEnvironment(EnvSpec(tmp_path / "t", image=BASE_IMAGE,
                                     app_source=lambda d: repos.checkout(str(calc_repo), row["base_commit"], d)))  # fmt: skip
    denv.start()
    agent_env = Environment(denv.app_dir, sandbox=BenchSandbox(denv), scratch_dir=tmp_path / "scratch")
    try:
        s = agent_env.terminals.open("sh", ["bash", "-i"], cols=100, rows=20)
        assert s.wait(pattern=r"/app# ?$", timeout_s=60) == "pattern", s._screen_text()  # the shell's prompt
        s.send("tty; echo $((6 * 7)); head -1 calc.py\n")
        assert s.wait(pattern=r"^def add", timeout_s=60) == "pattern", s._screen_text()
        screen = s._screen_text()
        assert "/dev/pts/" in screen and "not a tty" not in screen, screen
        assert "def add" in screen, screen  # /app is the trial's checkout
    finally:
        agent_env.close()
        denv.stop()
