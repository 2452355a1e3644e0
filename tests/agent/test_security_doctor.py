"""`glm5 doctor` and `glm5 code --sandbox-check` report each protection, tried for real."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.doctor import run_checks
from agent.sandbox import probe
from glm5cli.app import app


def test_doctor_json(repo):
    r = CliRunner().invoke(app, ["doctor", "--json", "--cwd", str(repo)])
    data = json.loads(r.stdout)
    names = [c["name"] for c in data["checks"]]
    assert "host git runs no repository programs" in names and "network off" in names
    assert "home and the rest of the disk hidden" in names
    assert r.exit_code == (0 if data["ok"] else 1)
    if probe(False) is None:  # here every protection must be active
        assert data["ok"], data
    else:
        assert not data["ok"] and any(c["ok"] is None for c in data["checks"])  # unknown, never passed


def test_sandbox_check_flag(repo):
    r = CliRunner().invoke(app, ["code", "--sandbox-check", "--cwd", str(repo)])
    assert "bubblewrap sandbox" in r.stdout and "not trusted" in r.stdout


def test_doctor_says_unknown_when_the_sandbox_cannot_run(monkeypatch):
    import agent.sandbox

    monkeypatch.setattr(agent.sandbox, "probe", lambda network: "no bwrap (test)")
    checks = {c.name: c for c in run_checks()}
    assert checks["bubblewrap sandbox"].ok is False and checks["network off"].ok is None
