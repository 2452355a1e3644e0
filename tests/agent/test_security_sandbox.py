"""The sandbox's next holes (issue 15): background jobs, a missing .glm5, credentials, binds, limits."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from agent.environment import Environment
from agent.sandbox import Sandbox, SandboxLimits, probe

pytestmark = pytest.mark.skipif(probe(False) is not None, reason=f"bwrap unusable here: {probe(False)}")


@pytest.fixture
def marker():
    p = Path(f"/var/tmp/glm5-bg-{uuid.uuid4().hex}")
    yield p
    p.unlink(missing_ok=True)


def test_a_background_job_stays_in_the_sandbox_and_dies_at_close(repo, tmp_path, marker):
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    job = env.start_background(f"touch {marker} 2>/dev/null; echo started; sleep 60; touch {repo}/late.txt")
    deadline = time.monotonic() + 20
    while "started" not in job.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marker.exists()
    env.close()
    assert job.proc.poll() is not None and not (repo / "late.txt").exists()


def test_a_command_cannot_create_glm5_settings(repo, tmp_path):
    assert not (repo / ".glm5").exists()
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    r = env.execute("echo inside; mkdir -p .glm5 && echo 'mode = \"auto\"' > .glm5/settings.toml")
    assert "inside" in r.output and not (repo / ".glm5" / "settings.toml").exists()


def test_credentials_are_masked(repo, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY\n")
    (home / ".netrc").write_text("machine x password hunter2\n")
    monkeypatch.setenv("HOME", str(home))
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    out = env.execute(f"echo inside; cat {home}/.ssh/id_rsa {home}/.netrc").output
    assert "inside" in out and "PRIVATE KEY" not in out and "hunter2" not in out


def test_binds_keep_protected_paths_read_only(repo, tmp_path):
    """A bench environment maps the repository to /app-like paths: .git stays read-only there too."""
    app = tmp_path / "app"  # a mount point that exists on the host (bwrap cannot create one under a read-only /)
    app.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    tests_dir = tmp_path / "tests"
    tests_dir.mkdir()
    (tests_dir / "t.sh").write_text("echo from-tests\n")
    sb = Sandbox(True)
    argv = sb.wrap(
        ["bash", "-c", f"echo ok > {app}/x.txt; echo '[x]' >> {app}/.git/config; echo l > {logs}/l.txt;"
         f" echo t > {app}/t2.txt; bash {app}/../tests/t.sh; echo w >> {tests_dir}/t.sh"],
        repo, repo, tmp_path / "scratch",
        binds=[(repo, app), (logs, logs)], ro_binds=[(tests_dir, tests_dir)],
    )  # fmt: skip
    (tmp_path / "scratch").mkdir()
    before = (repo / ".git" / "config").read_text()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (repo / "x.txt").read_text() == "ok\n" and (logs / "l.txt").exists()
    assert (repo / ".git" / "config").read_text() == before
    assert "from-tests" in r.stdout and (tests_dir / "t.sh").read_text() == "echo from-tests\n"


def test_limits(repo, tmp_path):
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch",
                      limits=SandboxLimits(memory_mb=256, file_mb=1))  # fmt: skip
    r = env.execute(
        "python3 -c 'x = bytearray(1 << 20)' && echo small; python3 -c 'x = bytearray(1 << 30)' && echo big"
    )
    assert "small" in r.output and "big" not in r.output
    env.execute("head -c 5000000 /dev/zero > big.bin")
    assert (repo / "big.bin").stat().st_size <= 1024 * 1024


def test_host_daemon_sockets_are_out_of_reach(repo, tmp_path):
    """A read-only bind does not stop connect(): a socket under /run (docker.sock, say) must not be visible."""
    import socket

    path = Path(f"/run/glm5-test-{uuid.uuid4().hex[:8]}.sock")
    try:
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(str(path))
    except OSError as e:
        pytest.skip(f"cannot create a socket under /run here: {e}")
    srv.listen(1)
    try:
        env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
        probe_cmd = (
            f"python3 -c \"import socket; c = socket.socket(socket.AF_UNIX); c.connect('{path}'); print('CONNECTED')\""
        )
        r = env.execute(f"echo inside; {probe_cmd}")
        assert "inside" in r.output and "CONNECTED" not in r.output, r.output
    finally:
        srv.close()
        path.unlink(missing_ok=True)


@pytest.fixture
def outside():
    """A folder outside /tmp and the home folder (the sandbox's /tmp is its own: nothing under tmp_path shows)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="glm5-view-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_view_is_an_allowlist_home_and_the_rest_of_the_disk_hidden(repo, tmp_path, outside, monkeypatch):
    # issue 40, item 6: the masked list was a short denylist over the whole disk: a setup read a credential file
    # outside it (here ~/.secret-token and a file in another folder), and a trial found the gold beside the task
    home = outside / "home"
    home.mkdir()
    (home / ".secret-token").write_text("TOKEN-123\n")
    (outside / "gold.patch").write_text("GOLD-DIFF\n")
    monkeypatch.setenv("HOME", str(home))
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    out = env.execute(f"echo inside; cat {home}/.secret-token {outside}/gold.patch; ls -A {home}; "
                      "python3 -c 'print(6*7)'; git --version; ls /usr/bin | head -1").output  # fmt: skip
    assert "inside" in out and "TOKEN-123" not in out and "GOLD-DIFF" not in out
    assert "42" in out and "git version" in out  # the toolchains and system folders are there, read-only


def test_the_user_adds_read_only_folders_to_the_view(repo, tmp_path, outside, monkeypatch):
    tools = outside / "toolchain"
    tools.mkdir()
    (tools / "tool.txt").write_text("TOOL\n")
    monkeypatch.setenv("GLM5_SANDBOX_READ_ONLY", str(tools))
    env = Environment(repo, sandbox=Sandbox(True), scratch_dir=tmp_path / "scratch")
    out = env.execute(f"cat {tools}/tool.txt; echo x > {tools}/new.txt").output
    assert "TOOL" in out and not (tools / "new.txt").exists()
