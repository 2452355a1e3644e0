"""Fence 6 (issue 15): the RL `command` reward runs model output in the sandbox, network off, with limits."""

from __future__ import annotations

import socket
import sys
import uuid
from pathlib import Path

import pytest

from agent.sandbox import probe
from plugins.builtin_rewards import _command

needs_bwrap = pytest.mark.skipif(probe(False) is not None, reason=f"bwrap unusable here: {probe(False)}")
RUN_IT = f"{sys.executable} completion.txt"  # a checker that runs the model's program, as code rewards do


@pytest.fixture
def marker():
    p = Path(f"/var/tmp/glm5-reward-{uuid.uuid4().hex}")
    yield p
    p.unlink(missing_ok=True)


@needs_bwrap
def test_the_completion_cannot_write_outside(marker):
    score = _command({"type": "command", "run": RUN_IT})
    assert score(f"open({str(marker)!r}, 'w').write('pwned')") == 0.0
    assert not marker.exists()
    assert score("print('fine')") == 1.0  # an honest completion still scores


@needs_bwrap
def test_the_completion_sees_no_secrets(monkeypatch):
    monkeypatch.setenv("GLM5_API_KEY", "glm5-secret-0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    score = _command({"type": "command", "run": RUN_IT})
    leak = "import os, sys; sys.exit(1 if any('SECRET' in k or 'API_KEY' in k for k in os.environ) else 0)"
    assert score(leak) == 1.0


@needs_bwrap
def test_the_completion_has_no_network():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        score = _command({"type": "command", "run": RUN_IT})
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        assert score(connect) == 0.0
    finally:
        srv.close()


@needs_bwrap
def test_memory_and_time_limits():
    score = _command({"type": "command", "run": RUN_IT, "memory_mb": 256, "timeout": 60})
    assert score("x = bytearray(16 * 1024 * 1024)") == 1.0  # a small allocation is fine
    assert score("x = bytearray(1024 * 1024 * 1024)") == 0.0  # a 1 GB allocation fails under 256 MB
    assert _command({"type": "command", "run": RUN_IT, "timeout": 3})("while True: pass") == 0.0  # killed


def test_a_sandbox_that_cannot_run_is_refused(monkeypatch):
    import agent.sandbox

    monkeypatch.setattr(agent.sandbox, "probe", lambda network: "bwrap is missing (test)")
    with pytest.raises(ValueError, match="needs the sandbox"):
        _command({"type": "command", "run": "true"})
    assert _command({"type": "command", "run": "true", "sandbox": False})("x") == 1.0  # an explicit opt-out
