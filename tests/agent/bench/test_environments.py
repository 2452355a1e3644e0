"""The environment registry and the docker environment (its real runs skip without a daemon)."""

from __future__ import annotations

import pytest

from agent.bench.docker_env import DockerEnvironment, docker_problem
from agent.bench.env_kinds import environment_kinds, make_environment
from agent.bench.environments import Environment, EnvSpec, InfraError
from agent.bench.local_env import LocalEnvironment


def test_builtin_kinds_and_a_plugin_kind(monkeypatch):
    kinds = environment_kinds()
    assert kinds["local"] is LocalEnvironment and kinds["docker"] is DockerEnvironment

    class Remote:
        def register_environments(self, register, context):
            register("remote", lambda spec: ("remote", spec))

    import agent.plugin_registry as reg

    real = reg.PluginManager

    monkeypatch.setattr(reg, "default_manager", lambda: real(entry_points=False, extra=(Remote(),)))
    assert make_environment("remote", EnvSpec(trial_dir="x"))[0] == "remote"
    with pytest.raises(ValueError, match="unknown environment 'nope'; known: docker, local, remote"):
        make_environment("nope", EnvSpec(trial_dir="x"))


def test_local_and_docker_follow_the_protocol(tmp_path):
    assert isinstance(LocalEnvironment(EnvSpec(tmp_path)), Environment)
    assert isinstance(DockerEnvironment(EnvSpec(tmp_path)), Environment)


def test_docker_without_a_daemon_says_so(tmp_path):
    if docker_problem() is None:  # checked now: another test may have started one (tests/agent/bench/docker_daemon)
        pytest.skip("a Docker daemon is present")
    env = DockerEnvironment(EnvSpec(tmp_path, image="python:3.11-slim"))
    with pytest.raises(InfraError, match="--env docker: .*use --env local"):
        env.start()


def test_docker_runs_commands_in_app(tmp_path):
    from agent.bench.docker_env import BASE_IMAGE
    from tests.agent.bench import docker_daemon

    why = docker_daemon.daemon() or docker_daemon.base_image()  # offline: glm5's base image, not Docker Hub's
    if why:
        pytest.skip(f"no Docker here: {why}")
    env = DockerEnvironment(EnvSpec(tmp_path, image=BASE_IMAGE, app_source=lambda d: d.mkdir()))
    env.start()
    try:
        r = env.exec("pwd && echo hi > /app/x && ls /logs")
        assert r.returncode == 0 and r.output.startswith("/app") and (env.app_dir / "x").read_text() == "hi\n"
    finally:
        env.stop()


def test_docker_pauses_the_container_while_the_host_works_on_its_files(tmp_path, monkeypatch):
    # issue 40, item 1: a docker container lives between commands, so a process a prediction or an agent left
    # running could swap a file for a link under the host's git; the host works with the container paused.
    # The docker CLI is outside glm5: a stand-in on PATH that records its arguments and succeeds, as docker does.
    from agent.bench.grading import frozen

    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.txt"
    (bindir / "docker").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    env = DockerEnvironment(EnvSpec(tmp_path / "t"))
    env.container = "glm5-bench-x"
    with frozen(env):
        assert calls.read_text().splitlines() == ["pause glm5-bench-x"]
    assert calls.read_text().splitlines() == ["pause glm5-bench-x", "unpause glm5-bench-x"]
    with frozen(LocalEnvironment(EnvSpec(tmp_path / "l"))):  # nothing outlives a local command: nothing to pause
        pass
