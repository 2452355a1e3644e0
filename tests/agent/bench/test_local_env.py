"""The local environment: a fresh clone per trial behind /app, commands in bubblewrap, Harbor's paths."""

from __future__ import annotations

import pytest

from agent.bench.environments import EnvSpec, InfraError
from agent.bench.local_env import LocalEnvironment
from agent.bench.repos import RepoCache, working_tree_diff
from agent.sandbox import probe
from tests.agent.bench.conftest import calc_row, sh

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")


def _env(tmp_path, repo, trial="t1"):
    row = calc_row(repo)
    cache = RepoCache(tmp_path / "run" / "cache")
    spec = EnvSpec(
        tmp_path / "run" / "trials" / trial, app_source=lambda d: cache.checkout(str(repo), row["base_commit"], d)
    )
    env = LocalEnvironment(spec)
    env.start()
    return env, row


def test_app_is_a_fresh_clone_and_the_users_repo_is_untouched(tmp_path, calc_repo):
    calc_row(calc_repo)  # the fixture's own git calls, before the snapshot
    before = sh(calc_repo, "for-each-ref"), sorted(p.name for p in (calc_repo / ".git").iterdir())
    env, row = _env(tmp_path, calc_repo)
    r = env.exec("pwd; cat calc.py; ls /logs; echo made > new.txt; sed -i s/a\\ -\\ b/a\\ +\\ b/ calc.py")
    assert r.returncode == 0, r.output
    assert r.output.startswith("/app\n") and "return a - b" in r.output and "agent" in r.output
    assert (env.app_dir / "new.txt").read_text() == "made\n"
    diff = working_tree_diff(env.app_dir, row["base_commit"])
    assert "+    return a + b" in diff and "new.txt" in diff and ".glm5" not in diff
    assert (sh(calc_repo, "for-each-ref"), sorted(p.name for p in (calc_repo / ".git").iterdir())) == before
    assert sh(calc_repo, "status", "--porcelain") == ""


def test_sandbox_fences_writes_network_and_git(tmp_path, calc_repo):
    env, _ = _env(tmp_path, calc_repo)
    outside = tmp_path / "outside.txt"
    env.exec(f"echo x > {outside}")  # lands in the private /tmp, if anywhere
    assert not outside.exists()
    assert env.exec("echo x > /var/tmp/glm5-bench-probe").returncode != 0  # the host's folders are read-only
    r = env.exec("echo evil >> .git/config")
    assert r.returncode != 0
    r = env.exec("python -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
    assert r.returncode != 0


def test_tests_and_solution_appear_only_when_copied_in(tmp_path, calc_repo):
    env, _ = _env(tmp_path, calc_repo)
    assert env.exec("ls /tests").returncode != 0
    src = tmp_path / "tests_src"
    src.mkdir()
    (src / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    env.copy_in(src, "/tests")
    assert env.exec("bash /tests/test.sh").returncode == 0
    assert (env.logs / "verifier" / "reward.txt").read_text() == "1\n"
    assert env.exec("touch /tests/x").returncode != 0  # read-only inside
    with pytest.raises(ValueError):
        env.host_path("/tests/../../escape")
    with pytest.raises(ValueError):
        env.host_path("/etc/passwd")


def test_timeout_kills_the_command(tmp_path, calc_repo):
    env, _ = _env(tmp_path, calc_repo)
    r = env.exec("sleep 30 & sleep 30", timeout_s=0.5)
    assert r.timed_out and r.returncode is None


def test_child_env_has_no_secrets(tmp_path, calc_repo, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    env, _ = _env(tmp_path, calc_repo)
    r = env.exec("env")
    assert "sk-secret" not in r.output


def test_missing_repo_is_an_infra_error(tmp_path):
    cache = RepoCache(tmp_path / "cache")
    with pytest.raises(InfraError, match="neither a folder"):
        cache.source("not a repo at all")


def test_setup_runs_once_per_repo_and_version_and_is_read_only_after(tmp_path, calc_repo):
    row = calc_row(calc_repo)
    repos = RepoCache(tmp_path / "cache")
    setup = "python -c \"import sys, pathlib; pathlib.Path(sys.prefix, 'made').write_text('1')\" && echo ran >> /logs/agent/setup"

    def env_for(trial):
        spec = EnvSpec(tmp_path / trial, app_source=lambda d: repos.checkout(str(calc_repo), row["base_commit"], d),
                       setup=setup, setup_key="calc@1.0", cache_dir=tmp_path / "cache")  # fmt: skip
        e = LocalEnvironment(spec)
        e.start()
        return e

    a, b = env_for("a"), env_for("b")
    assert a.venv == b.venv and (a.venv / "made").read_text() == "1"
    assert (tmp_path / "a" / "logs" / "agent" / "setup").exists() and not (
        tmp_path / "b" / "logs" / "agent" / "setup"
    ).exists()
    r = b.exec("python -c 'import sys; print(sys.prefix)' && python -c 'import pytest' && touch $VIRTUAL_ENV/x")
    assert str(b.venv) in r.output and r.returncode != 0  # the venv's python (not glm5's packages), read-only
    assert not (b.venv / "x").exists()


def test_a_command_that_prints_without_end_keeps_its_start_and_its_end(tmp_path, calc_repo, monkeypatch):
    # 100 MB of output cost 100 MB of memory and landed whole in the trial's logs; a test log's summary is at its end
    import agent.bench.process as process

    monkeypatch.setattr(process, "OUTPUT_HEAD", 1000)
    monkeypatch.setattr(process, "OUTPUT_TAIL", 2000)
    env, _ = _env(tmp_path, calc_repo)
    r = env.exec("echo FIRST; head -c 50000 /dev/zero | tr '\\0' x; echo; echo LAST")
    assert r.output.startswith("FIRST") and r.output.rstrip().endswith("LAST") and len(r.output) < 3200
    assert "bytes of output left out" in r.output
    small = env.exec("echo hi")
    assert small.output == "hi\n"
