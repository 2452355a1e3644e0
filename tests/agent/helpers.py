"""Builds a session against the fake endpoint with test-friendly settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.builder import build_session
from agent.settings import load_settings
from agent.ui import YES, AgentUI


class RecordingUI(AgentUI):
    """Remembers what the agent told it and answers approvals from a list (default: yes)."""

    def __init__(self, answers: list[str] | None = None):
        self.answers = list(answers or [])
        self.requests: list[Any] = []
        self.notices: list[str] = []
        self.deltas: list[tuple[str, str]] = []
        self.tool_ends: list[tuple[str, Any]] = []

    def on_delta(self, kind, text):
        self.deltas.append((kind, text))

    def on_notice(self, text):
        self.notices.append(text)

    def on_tool_end(self, name, result):
        self.tool_ends.append((name, result))

    def approve(self, request):
        self.requests.append(request)
        return self.answers.pop(0) if self.answers else YES


def make_session(repo: Path, fake, ui: AgentUI | None = None, flags: dict[str, Any] | None = None, **kw):
    # "trust": the tests' repositories are the user's own, so their .glm5 settings (hooks, MCP servers) apply
    flags = {"base_url": fake.base_url, "model": "fake-glm", "sandbox": False, "trust": True, **(flags or {})}
    settings = load_settings(repo, flags)
    return build_session(repo, settings, ui or RecordingUI(), **kw)
