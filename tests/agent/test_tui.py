"""The TUI through Textual's pilot: a task with an inline approval, streamed answer, diff, /undo, !cmd, Esc."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Input, Markdown, Static

from agent.tui.app import CodeApp
from agent.tui.widgets import ApprovalBar, ToolOutput
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


async def until(pilot, cond, timeout=15.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("timed out waiting in the TUI")
        await pilot.pause(0.05)


async def submit(pilot, app, text):
    app.query_one("#prompt", Input).value = text
    await pilot.press("enter")


def texts(app):
    out = []
    for w in app.query_one("#log").children:
        if isinstance(w, Markdown):
            out.append(w.source)
        elif isinstance(w, Static):
            out.append(str(w.render()))
    return "\n".join(out)


@pytest.mark.asyncio
async def test_tui_task_with_approval_diff_undo_and_shell(repo, fake_model):
    fake_model.script = [
        reply(reasoning="need to look", tools=[("read", {"path": "calc.py"})]),
        reply(tools=[("edit", {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"})]),
        reply("**Fixed** the operator in `calc.py`."),
    ]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test(size=(120, 40)) as pilot:
        await submit(pilot, app, "fix add in @calc.py")
        bar = app.query_one("#approval", ApprovalBar)
        await until(pilot, lambda: bar.display)
        assert "Allow edit: calc.py" in str(bar.query_one("#approval-text", Static).render())
        await pilot.press("y")
        await until(pilot, lambda: not app.busy)
        assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
        log = texts(app)
        assert "**Fixed** the operator" in log and "need to look" in log
        assert any((w.__class__ is ToolOutput) for w in app.query_one("#log").children)
        # the @mention attached the file to the task
        assert '<file path="calc.py">' in fake_model.requests[0]["messages"][1]["content"]
        assert "tokens" in str(app.query_one("#status", Static).render())

        await submit(pilot, app, "/undo")
        await pilot.pause(0.1)
        assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
        assert "undid turn 1" in texts(app)

        await submit(pilot, app, "!echo from-the-user")
        await until(pilot, lambda: not app.busy)
        assert "from-the-user" in texts(app)
        assert "I ran `echo from-the-user`" in app.session.agent.messages[-1]["content"]

        await pilot.press("shift+tab")
        assert app.session.agent.permissions.mode == "accept-edits"
        assert "accept-edits" in str(app.query_one("#status", Static).render())

        await submit(pilot, app, "/cost")
        await pilot.pause(0.1)
        assert "completion tokens" in texts(app)


@pytest.mark.asyncio
async def test_tui_escape_interrupts_a_running_command(repo, fake_model):
    fake_model.script = [reply(tools=[("bash", {"command": "sleep 30"})]), reply("never reached")]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui, flags={"mode": "auto"}))
    async with app.run_test() as pilot:
        await submit(pilot, app, "wait a long time")
        await until(pilot, lambda: "sleep 30" in texts(app))
        await pilot.press("escape")
        await until(pilot, lambda: not app.busy, timeout=10)
        assert "interrupted" in texts(app)
        assert len(fake_model.requests) == 1
