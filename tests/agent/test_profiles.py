"""Agent profiles (agent/profiles.py): the compact profile offers four tools and a short prompt, everywhere the
agent is built (config, flag, environment, the bench's glm5 agent); the default stays the full agent."""

from __future__ import annotations

import json

import pytest

from agent import context
from agent.bench.agents import AgentLimits, Glm5Agent
from agent.settings import SettingsError, load_settings
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session


def _first_request(fake_model, repo, flags=None):
    fake_model.script = [reply("nothing to do")]
    s = make_session(repo, fake_model, flags=flags)
    try:
        s.agent.run("look around")
    finally:
        s.close()
    req = fake_model.requests[-1]  # a run of one model call
    return [t["function"]["name"] for t in req["tools"]], req["messages"][0]["content"], req["tools"]


def test_default_is_the_full_agent(repo, fake_model):
    tools, system, _ = _first_request(fake_model, repo)
    assert set(tools) >= {"read", "write", "edit", "glob", "grep", "bash", "todo"}
    assert system.startswith(context.SYSTEM_PROMPT.split("\n")[0])


def test_compact_profile_sends_four_tools_and_a_short_prompt(repo, fake_model, isolated_config):
    (isolated_config / "config.toml").write_text('[agent]\nprofile = "compact"\n')
    tools, system, offered = _first_request(fake_model, repo)
    schemas = {t["function"]["name"]: t["function"] for t in offered}
    _, full_system, offered = _first_request(fake_model, repo, flags={"profile": "full"})  # the flag beats the file
    full_schemas = {t["function"]["name"]: t["function"] for t in offered}
    # one-sentence descriptions, required arguments only: the schemas are a fraction of the full ones
    assert list(schemas["read"]["parameters"]["properties"]) == ["path"]
    assert sorted(schemas["edit"]["parameters"]["required"]) == ["new_string", "old_string", "path"]
    assert schemas["bash"]["description"].endswith(".") and schemas["bash"]["description"].count(". ") == 0
    assert len(json.dumps(schemas)) < len(json.dumps({k: full_schemas[k] for k in schemas})) / 2
    assert sorted(tools) == ["bash", "edit", "glob", "read"]
    assert f"Working folder: {repo}" in system and "glob, grep and read" not in system
    assert len(system) < len(full_system) / 2


def test_compact_prompt_keeps_the_repository_instructions(repo, fake_model):
    (repo / "AGENTS.md").write_text("Always run pytest -q.\n")
    _, system, _ = _first_request(fake_model, repo, flags={"profile": "compact"})
    assert "Always run pytest -q." in system


def test_unknown_profile_is_a_clear_error(isolated_config, monkeypatch):
    monkeypatch.setenv("GLM5_AGENT_PROFILE", "tiny")
    with pytest.raises(SettingsError, match="'tiny' is not one of full, compact"):
        load_settings(None, {})
    monkeypatch.delenv("GLM5_AGENT_PROFILE")
    (isolated_config / "config.toml").write_text('[agent]\nprofile = "compact"\n')
    assert load_settings(None, {}).profile == "compact"


def test_bench_agent_option_reaches_the_session_and_the_run_description(tmp_path, fake_model):
    agent = Glm5Agent(base_url=fake_model.base_url, model="fake-glm", profile="compact")
    s = agent.settings(tmp_path, AgentLimits(max_turns=3))
    assert s.profile == "compact"
    assert json.loads(json.dumps(agent.describe()))["profile"] == "compact"
    assert Glm5Agent(base_url=fake_model.base_url, model="fake-glm").describe()["profile"] == "full"


def test_terminal_tools_in_full_by_default_and_in_compact_when_asked(repo, fake_model, isolated_config, monkeypatch):
    terminal = ["terminal_open", "terminal_send", "terminal_read", "terminal_resize", "terminal_close"]
    tools, _, _ = _first_request(fake_model, repo)
    assert [t for t in tools if t.startswith("terminal_")] == terminal
    tools, _, _ = _first_request(fake_model, repo, flags={"terminal": False})
    assert not [t for t in tools if t.startswith("terminal_")]
    (isolated_config / "config.toml").write_text('[agent]\nprofile = "compact"\nterminal = true\n')
    tools, _, offered = _first_request(fake_model, repo)
    assert sorted(tools) == ["bash", "edit", "glob", "read", "terminal_close", "terminal_open", "terminal_read",
                             "terminal_send"]  # fmt: skip
    send = next(t["function"] for t in offered if t["function"]["name"] == "terminal_send")
    assert send["parameters"]["required"] == ["session", "input"]
    (isolated_config / "config.toml").write_text('[agent]\nterminal = "yes"\n')
    with pytest.raises(SettingsError, match="terminal .* must be true or false"):
        load_settings(None, {})
    monkeypatch.setenv("GLM5_AGENT_TERMINAL", "no")  # the environment beats the file
    assert load_settings(None, {}).terminal is False
    monkeypatch.setenv("GLM5_AGENT_TERMINAL", "maybe")
    with pytest.raises(SettingsError, match="must be true or false, not 'maybe'"):
        load_settings(None, {})
