"""Fixtures: a real temporary git repository, the scripted model endpoint, an isolated config folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent.fake_model import FakeModel


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    d = tmp_path / "config"
    d.mkdir()
    monkeypatch.setenv("GLM5_CONFIG_DIR", str(d))
    for k in (
        "GLM5_BASE_URL",
        "GLM5_MODEL",
        "GLM5_PROVIDER",
        "GLM5_PERMISSION_MODE",
        "GLM5_API_KEY_ENV",
        "GLM5_AGENT_PROFILE",
        "GLM5_AGENT_TERMINAL",
    ):
        monkeypatch.delenv(k, raising=False)
    return d


@pytest.fixture
def repo(tmp_path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "t@example.com")
    git(r, "config", "user.name", "Test")
    (r / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (r / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (r / ".gitignore").write_text("__pycache__/\n*.log\n.pytest_cache/\n")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "init")
    return r


@pytest.fixture
def fake_model():
    m = FakeModel()
    yield m
    m.close()
