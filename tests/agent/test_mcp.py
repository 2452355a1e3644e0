"""MCP servers named in settings: their tools reach the model and run, over stdio and streamable HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.trajectory import Trajectory
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session

SERVER = Path(__file__).with_name("mcp_server.py")


def test_stdio_mcp_tool_used_by_the_agent(repo, fake_model):
    (repo / ".glm5").mkdir()
    (repo / ".glm5" / "settings.toml").write_text(
        f'[mcp_servers.calc]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n'
        '[permissions]\nallow = ["mcp__calc__*"]\n'
    )
    fake_model.script = [reply(tools=[("mcp__calc__add", {"a": 2, "b": 40})]), reply("2 + 40 = 42")]
    s = make_session(repo, fake_model)
    try:
        s.agent.run("add 2 and 40 with the calc server")
    finally:
        s.close()
    offered = {t["function"]["name"]: t["function"] for t in fake_model.requests[0]["tools"]}
    assert offered["mcp__calc__add"]["parameters"]["required"] == ["a", "b"] and "mcp__calc__shout" in offered
    assert fake_model.requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_0", "content": "42"}
    rec = next(r for r in Trajectory.load(s.path).records if r["type"] == "tool")
    assert rec["name"] == "mcp__calc__add" and rec["decision"] == "allow"


def test_broken_mcp_server_is_a_warning_not_a_crash(repo, fake_model):
    (repo / ".glm5").mkdir()
    (repo / ".glm5" / "settings.toml").write_text('[mcp_servers.bad]\ncommand = "/nonexistent/server"\n')
    s = make_session(repo, fake_model)
    s.close()
    assert any("bad" in w and "failed to start" in w for w in s.warnings)


@pytest.fixture
def http_server():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stderr=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def test_streamable_http_mcp_tool(repo, fake_model, http_server):
    (repo / ".glm5").mkdir()
    (repo / ".glm5" / "settings.toml").write_text(f'[mcp_servers.web]\nurl = "{http_server}"\n')
    fake_model.script = [reply(tools=[("mcp__web__shout", {"text": "quiet"})]), reply("done")]
    s = make_session(repo, fake_model, flags={"mode": "auto"})
    try:
        s.agent.run("shout")
    finally:
        s.close()
    assert fake_model.requests[1]["messages"][-1]["content"] == "QUIET"
