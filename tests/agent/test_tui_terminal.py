"""The TUI's terminal pane (agent/tui/terminal_pane.py) through Textual's pilot: Ctrl+T shows the agent's live
terminal session, the next one, then closes; an approval of a line sent to a shell shows that line."""

from __future__ import annotations

import pytest
from textual.widgets import Input

from agent.tui.app import CodeApp
from agent.tui.terminal_pane import TerminalPane
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session
from tests.agent.test_tui import asked, until


def _pane_text(app) -> str:
    return str(app.query_one("#terminal", TerminalPane).render())


@pytest.mark.asyncio
async def test_the_pane_shows_the_live_screen_and_approvals_show_the_line(repo, fake_model):
    fake_model.script = [
        reply(tools=[("terminal_open", {"session": "main"})]),
        reply(tools=[("terminal_open", {"session": "other"})]),
        reply(tools=[("terminal_send", {"session": "main", "wait_for": "pane-42",
                                        "input": ["printf '\\033]0;title\\007pane-%s\\n' $((6*7))\n"]})]),  # fmt: skip
        reply("Both open."),
    ]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test(size=(120, 50)) as pilot:
        pane = app.query_one("#terminal", TerminalPane)
        assert not pane.display
        bar = await asked(pilot, app, "open terminals")  # ask mode: the line to be run is asked about
        assert "pane-%s" in bar.preview_text and "session 'main'" in bar.preview_text
        await pilot.press("y")
        await until(pilot, lambda: not app.busy)
        await pilot.press("ctrl+t")
        await until(pilot, lambda: "pane-42" in _pane_text(app))
        assert pane.display and "terminal main (running)" in str(pane.border_title) and "other" in pane.border_title
        await pilot.press("ctrl+t")  # the next session
        await until(pilot, lambda: "terminal other" in str(pane.border_title))
        await pilot.press("ctrl+t")  # closed
        assert not pane.display
        assert app.query_one("#prompt", Input)
