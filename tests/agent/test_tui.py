"""The TUI through Textual's pilot: a task with an inline approval, streamed answer, diff, /undo, !cmd, Esc."""

from __future__ import annotations

import asyncio

import pytest
from rich.syntax import Syntax
from textual.widgets import Input, Markdown, Static

from agent.tui.app import CodeApp
from agent.tui.widgets import ApprovalBar, ToolOutput
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


async def until(pilot, cond, timeout=30.0):  # generous: the test machine may be shared and busy
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("timed out waiting in the TUI")
        await pilot.pause(0.05)


async def submit(pilot, app, text):
    app.query_one("#prompt", Input).value = text
    await pilot.press("enter")


async def asked(pilot, app, text) -> ApprovalBar:
    """Submit `text` and wait for the first approval; the bar that asks."""
    bar = app.query_one("#approval", ApprovalBar)
    await submit(pilot, app, text)
    await until(pilot, lambda: bar.display)
    return bar


def title(bar) -> str:
    return str(bar.query_one("#approval-text", Static).render())


def texts(app):
    out = []
    for w in app.query_one("#log").children:
        if isinstance(w, Markdown):
            out.append(w.source)
        elif isinstance(w, Static):
            content = w.content
            out.append(content.code if isinstance(content, Syntax) else str(w.render()))
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
        bar = await asked(pilot, app, "fix add in @calc.py")
        assert "Allow edit?" in title(bar)
        assert "+    return a + b" in bar.preview_text  # the diff, before the edit runs
        await pilot.press("y")
        await until(pilot, lambda: not app.busy)
        assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
        log = texts(app)
        assert "**Fixed** the operator" in log and "need to look" in log
        assert any((w.__class__ is ToolOutput) for w in app.query_one("#log").children)
        # the @mention attached the file to the task
        assert '<file path="calc.py">' in fake_model.requests[0]["messages"][1]["content"]
        assert "tokens" in str(app.query_one("#status", Static).render())

        await submit(pilot, app, "/diff")
        await until(pilot, lambda: "+    return a + b" in texts(app).split("/diff")[-1])

        await submit(pilot, app, "/undo")
        await pilot.pause(0.1)
        assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
        assert "undid the latest turn (turn 1)" in texts(app)

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


def long_reply(tag: str, n: int = 60):
    return reply("\n\n".join(f"{tag} line {i}" for i in range(n)))


@pytest.mark.asyncio
async def test_new_output_keeps_the_view_at_the_bottom_unless_the_user_scrolled_up(repo, fake_model):
    fake_model.script = [long_reply("first"), long_reply("second")]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test(size=(80, 16)) as pilot:
        log = app.log_view
        marker = app.query_one("#new-output")
        await submit(pilot, app, "write a lot")
        await until(pilot, lambda: not app.busy)
        await until(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)
        await pilot.pause(0.3)  # the streamed markdown has settled: still at the bottom, the last line in view
        assert log.scroll_y == log.max_scroll_y and not marker.display

        await pilot.press("pageup")
        where = log.scroll_y
        assert where < log.max_scroll_y and not log.following
        await submit(pilot, app, "more")
        await until(pilot, lambda: not app.busy)
        await until(pilot, lambda: marker.display)  # new output below, the view stays where the user put it
        await pilot.pause(0.3)
        assert log.scroll_y == where and log.scroll_y < log.max_scroll_y

        await pilot.press("end")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y and not marker.display)
        assert log.following


@pytest.mark.asyncio
async def test_no_with_a_message_and_always_with_an_edited_saved_rule(repo, fake_model):
    fake_model.script = [
        reply(tools=[("bash", {"command": "touch a.txt"})]),
        reply(tools=[("bash", {"command": "touch b.txt"})]),
        reply(tools=[("bash", {"command": "touch c.txt"})]),
        reply("done"),
    ]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test(size=(120, 40)) as pilot:
        bar = await asked(pilot, app, "touch things")
        assert bar.preview_text == "touch a.txt"  # the whole command before asking
        await pilot.press("n")
        box = bar.query_one("#approval-input", Input)
        await until(pilot, lambda: box.display and box.has_focus)
        await pilot.press(*"use the fixture")
        await pilot.press("enter")

        await until(pilot, lambda: bar.display and bar.stage == "choose" and "b.txt" in bar.preview_text)
        await pilot.press("a")
        await until(pilot, lambda: box.display and box.has_focus)
        assert box.value == bar.request.suggested_rule and box.value.startswith("bash(touch")
        box.value = "bash(touch:*)"  # the user widens it on purpose
        await pilot.press("enter")
        await until(pilot, lambda: bar.stage == "scope")
        await pilot.press("r")
        await until(pilot, lambda: not app.busy)

    assert not (repo / "a.txt").exists() and (repo / "b.txt").exists()
    tool_msgs = [m["content"] for m in fake_model.requests[1]["messages"] if m["role"] == "tool"]
    assert "The user says: use the fixture" in tool_msgs[0]
    assert (repo / "c.txt").exists()  # the third call ran without asking: the rule held
    assert len(fake_model.requests) == 4
    import agent.settings

    if hasattr(agent.settings, "save_rule"):
        saved = (repo / ".glm5" / "settings.local.toml").read_text()
        assert "bash(touch:*)" in saved


@pytest.mark.asyncio
async def test_token_count_moves_while_a_reply_streams(repo, fake_model):
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test() as pilot:
        status = app.query_one("#status", Static)
        app.busy = True
        await pilot.pause(0.15)  # past the redraw interval since the status line was drawn at start-up
        await app.stream_delta("content", "x" * 400)
        first = str(status.render())
        await pilot.pause(0.15)  # the live estimate is redrawn at most every 0.1 s
        await app.stream_delta("content", "y" * 400)
        assert "~100 tokens" in first and "~200 tokens" in str(status.render())
        await app.end_stream({"role": "assistant", "content": "x"})
        app.refresh_status()
        assert "tokens ·" not in str(status.render()).split("context")[-1]
        await pilot.pause()


@pytest.mark.asyncio
async def test_the_live_count_shows_a_bursts_last_deltas_and_goes_when_the_turn_ends(repo, fake_model):
    # the report: "~606 tokens" stood while far more streamed, and stayed after Ctrl-C
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test() as pilot:
        status = app.query_one("#status", Static)
        app.busy = True
        await pilot.pause(0.15)
        await app.stream_delta("reasoning", "x" * 400)
        await app.stream_delta("reasoning", "y" * 400)  # within the redraw interval: not drawn by the delta
        await pilot.pause(0.6)  # no further delta: the clock draws it
        assert "~200 tokens" in str(status.render()), str(status.render())
        app._done()  # the turn ended without the reply's end (interrupted)
        assert "tokens ·" not in str(status.render()).split("context")[-1], str(status.render())
        await pilot.pause()


@pytest.mark.asyncio
async def test_ctrl_c_interrupts_the_turn_and_a_second_one_quits(repo, fake_model):
    fake_model.script = [reply(tools=[("bash", {"command": "sleep 30"})]), reply("never reached")]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui, flags={"mode": "auto"}))
    async with app.run_test() as pilot:
        await submit(pilot, app, "wait a long time")
        await until(pilot, lambda: "sleep 30" in texts(app))
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.busy, timeout=10)
        assert "interrupted" in texts(app) and app.is_running
        assert "Press" not in texts(app)  # not Textual's "press ... to quit" hint
        await pilot.press("ctrl+c")  # within the window: quits
        await until(pilot, lambda: not app.is_running, timeout=5)


@pytest.mark.asyncio
async def test_ctrl_c_when_idle_clears_the_prompt_then_quits(repo, fake_model):
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test() as pilot:
        app.query_one("#prompt", Input).value = "half a thought"
        await pilot.press("ctrl+c")
        assert app.query_one("#prompt", Input).value == "" and app.is_running
        app._last_ctrl_c = float("-inf")  # as if a while has passed
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, timeout=5)


@pytest.mark.asyncio
async def test_a_fast_stream_ends_with_its_last_line_in_view(repo, fake_model):
    """The deltas as the bridge hands them over, faster than the markdown renders: the stream's last writes
    land after it stopped. The old log scrolled after each write only and ended lines short of the bottom."""
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test(size=(80, 16)) as pilot:
        log = app.log_view
        for i in range(40):
            app.add(Static(f"earlier line {i}"))
        await pilot.pause(0.2)
        text = "".join(f"answer {i}\n\n" for i in range(40))
        for k in range(0, len(text), 7):
            await app.stream_delta("content", text[k : k + 7])
        await app.end_stream({"role": "assistant", "content": text})
        await until(pilot, lambda: log.max_scroll_y > 100 and log.scroll_y == log.max_scroll_y)
        await pilot.pause(0.5)
        assert log.scroll_y == log.max_scroll_y


@pytest.mark.asyncio
async def test_calls_refused_without_an_ask_are_shown_with_why(repo, fake_model):
    # A malformed call (no `path`) and a call a deny rule refuses never reach the approval bar; the log still
    # shows each call and why it did not run. A call the user said no to is shown once, with their answer; one
    # a hook blocks after their yes is shown once, with the hook's why.
    (repo / ".glm5").mkdir(exist_ok=True)
    (repo / ".glm5" / "settings.toml").write_text(
        '[hooks]\nPreToolUse = [{ matcher = "bash", command = "grep -q rmdir || exit 0; echo keep it >&2; exit 2" }]\n'
    )
    fake_model.script = [
        reply(tools=[("edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})]),
        reply(tools=[("bash", {"command": "git push origin main"})]),
        reply(tools=[("bash", {"command": "touch made.txt"})]),
        reply(tools=[("bash", {"command": "rmdir build"})]),
        reply("Gave up."),
    ]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui, flags={"deny": ("bash(git push)",)}))
    async with app.run_test(size=(120, 40)) as pilot:
        bar = await asked(pilot, app, "fix add")
        assert "bash(touch:*)" in title(bar)  # the first ask
        await pilot.press("n")
        await pilot.press("enter")
        await until(pilot, lambda: bar.display and "rmdir" in title(bar))
        await pilot.press("y")
        await until(pilot, lambda: not app.busy)
        log = texts(app)
        assert "● edit(" in log and "refused: missing required argument `path`" in log
        assert "● bash(git push origin main)" in log and "refused: blocked by a PreToolUse hook: keep it" in log
        assert log.count("refused:") == 3
        assert log.count("● bash(touch made.txt)") == 1 and not (repo / "made.txt").exists()
        assert log.count("● bash(rmdir build)") == 1


@pytest.mark.asyncio
async def test_escape_codes_from_the_model_or_the_repository_never_reach_the_terminal(repo, fake_model):
    # A title, a clipboard write or text hidden from the approval prompt: what the model streams, the calls it
    # makes and what a file holds are drawn with every control character escaped.
    (repo / "evil.txt").write_text("line\x1b]52;c;cm0gLXJm\x07 \x1b[8mhidden\x1b[0m\n")
    fake_model.script = [
        reply("Look\x1b]2;owned\x07.", reasoning="think\x1b[2J", tools=[("read", {"path": "evil.txt"})]),
        reply(tools=[("bash", {"command": "touch ok \x1b[8m; rm -rf ~"})]),
        reply("Done \u202eexe.txt"),
    ]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test(size=(120, 40)) as pilot:
        bar = await asked(pilot, app, "look")
        shown = title(bar)
        assert "\x1b" not in shown + bar.preview_text and "\\x1b[8m; rm -rf ~" in bar.preview_text
        await pilot.press("n")
        await pilot.press("enter")
        await until(pilot, lambda: not app.busy)
        log = texts(app)
        for shown in ("Look\\x1b]2;owned\\x07.", "think\\x1b[2J", "\\x1b]52;c;cm0gLXJm\\x07", "Done \\u202eexe.txt"):
            assert shown in log, shown
        assert not any(c in log for c in "\x1b\x07\u202e")


@pytest.mark.asyncio
async def test_always_shows_a_proposed_rule_with_escape_codes_escaped_and_keeps_it_as_proposed(repo, fake_model):
    # "always" puts the proposed rule in an Input, which draws its value raw: the model's escape codes are shown
    # escaped there, and the rule the user confirms unedited is the one proposed (it matches the call again)
    cmd = "touch ok\x1b]2;x\x07"
    fake_model.script = [
        reply(tools=[("bash", {"command": cmd})]),
        reply(tools=[("bash", {"command": cmd})]),
        reply("ok"),
    ]
    app = CodeApp(lambda ui: make_session(repo, fake_model, ui))
    async with app.run_test(size=(120, 40)) as pilot:
        bar = await asked(pilot, app, "touch")
        await pilot.press("a")
        box = bar.query_one("#approval-input", Input)
        await until(pilot, lambda: box.display and box.has_focus)
        assert "\x1b" not in box.value and "\x07" not in box.value and "\\x1b]2;x\\x07" in box.value
        await pilot.press("enter")
        await until(pilot, lambda: bar.stage == "scope")
        assert bar.rule == bar.request.suggested_rule and "\x1b" in bar.rule
        await pilot.press("s")
        await until(pilot, lambda: not app.busy)
    assert len(fake_model.requests) == 3  # the second, identical call ran under the rule without an ask
