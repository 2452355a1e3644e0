"""The bubblewrap sandbox: repository writable, the rest read-only, network off. Skipped where bwrap cannot run."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

import pytest

from agent.environment import Environment
from agent.sandbox import Sandbox, probe
from agent.tools import BashTool
from agent.tools.base import ToolContext, ToolState
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session

needs_bwrap = pytest.mark.skipif(probe(False) is not None, reason=f"bwrap unusable here: {probe(False)}")


@needs_bwrap
def test_commands_in_the_sandbox(repo, tmp_path, fake_model):
    (repo / ".glm5").mkdir()
    (repo / ".glm5" / "settings.toml").write_text("")
    scratch = repo / ".glm5" / "tmp" / "s1"
    env = Environment(repo, sandbox=Sandbox(True, network=False), scratch_dir=scratch)
    assert env.execute("echo hi > inside.txt").returncode == 0
    assert env.execute("echo 'mode = \"auto\"' >> .glm5/settings.toml").returncode != 0
    assert (repo / ".glm5" / "settings.toml").read_text() == ""
    assert env.execute(f"echo log > {scratch}/job.log").returncode == 0
    assert (repo / "inside.txt").read_text() == "hi\n"
    outside = f"/var/tmp/glm5-sandbox-{uuid.uuid4().hex}"
    r = env.execute(f"touch {outside}")
    assert r.returncode != 0 and not os.path.exists(outside)
    port = fake_model.base_url.split(":")[2].split("/")[0]
    probe_net = f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\""
    assert env.execute(probe_net).returncode != 0
    open_env = Environment(repo, sandbox=Sandbox(True, network=True), scratch_dir=tmp_path / "scratch")
    assert open_env.execute(probe_net).returncode == 0
    # the timeout still kills everything the command started
    r = env.execute("sleep 30 & sleep 30", timeout_s=1)
    assert r.timed_out


def test_warning_when_the_sandbox_is_off(repo, fake_model):
    s = Sandbox(enabled=False)
    assert not s.active and "WITHOUT a sandbox" in s.warning
    fake_model.script = [reply("ok")]
    sess = make_session(repo, fake_model)  # tests turn the sandbox off
    assert any("WITHOUT a sandbox" in w for w in sess.warnings)
    assert "WITHOUT a sandbox" in sess.agent.messages[0]["content"]  # the model is told too
    sess.close()


@needs_bwrap
def test_a_background_job_outlives_the_turn_thread_that_started_it(repo, tmp_path):
    # bubblewrap's --die-with-parent follows the thread that started it: a job started in one TUI turn (a worker
    # thread that ends with the turn) was killed as that turn ended
    ctx = ToolContext(Environment(repo, sandbox=Sandbox(True, network=False), scratch_dir=tmp_path / "s"), ToolState())
    out = []
    turn = threading.Thread(
        target=lambda: (
            out.append(BashTool().run({"command": "echo started; sleep 3; echo finished", "background": True}, ctx)),
            time.sleep(0.5),
        )
    )
    turn.start()
    turn.join()
    log = out[0].data["log_path"]
    deadline = time.monotonic() + 15
    while "finished" not in open(log).read() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open(log).read() == "started\nfinished\n"
    ctx.env.close()
