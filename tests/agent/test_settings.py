"""Settings precedence: flags > GLM5_* > repo files > global file > defaults; named providers."""

from __future__ import annotations

import pytest

from agent.redact import REDACTED, Redactor
from agent.settings import SettingsError, load_settings


def test_precedence_and_providers(tmp_path, isolated_config, monkeypatch):
    (isolated_config / "config.toml").write_text(
        'provider = "mine"\n[providers.mine]\nbase_url = "http://global/v1"\nmodel = "g"\ninput_cost_per_mtok = 2.0\n'
        '[permissions]\nmode = "accept-edits"\ndeny = ["bash(git push)"]\n'
    )
    repo = tmp_path / "r"
    (repo / ".glm5").mkdir(parents=True)
    (repo / ".glm5" / "settings.toml").write_text(
        '[providers.mine]\nmodel = "repo-model"\n[permissions]\ndeny = ["bash(rm)"]\n'
    )
    s = load_settings(repo, trusted=True)  # a trusted repository may pick the model (an untrusted one may not)
    assert (s.provider.base_url, s.provider.model, s.mode) == ("http://global/v1", "repo-model", "accept-edits")
    assert load_settings(repo).provider.model == "g"
    assert s.deny == ("bash(git push)", "bash(rm)")  # lists add up: a repo cannot drop a global deny
    assert s.provider.cost({"prompt_tokens": 1_000_000, "completion_tokens": 0}) == 2.0
    monkeypatch.setenv("GLM5_MODEL", "env-model")
    monkeypatch.setenv("GLM5_PERMISSION_MODE", "plan")
    s = load_settings(repo)
    assert s.provider.model == "env-model" and s.mode == "plan"
    s = load_settings(repo, {"model": "flag-model", "mode": "auto", "provider": "zai"})
    assert s.provider.model == "flag-model" and s.mode == "auto" and "z.ai" in s.provider.base_url


def test_bad_settings_name_the_problem(tmp_path, isolated_config):
    (isolated_config / "config.toml").write_text("provider = [")
    with pytest.raises(SettingsError, match="config.toml: not valid TOML"):
        load_settings(tmp_path)
    (isolated_config / "config.toml").write_text('provider = "nope"')
    with pytest.raises(SettingsError, match="unknown provider 'nope'"):
        load_settings(tmp_path)
    (isolated_config / "config.toml").write_text("")
    with pytest.raises(SettingsError, match="permission mode"):
        load_settings(tmp_path, {"mode": "yolo"})
    for bad in ("-1", '"7"', "true", "1.5"):
        (isolated_config / "config.toml").write_text(f"[agent]\nseed = {bad}\n")
        with pytest.raises(SettingsError, match="seed"):
            load_settings(tmp_path)
    (isolated_config / "config.toml").write_text("[agent]\nseed = 7\n")
    assert load_settings(tmp_path).seed == 7


def test_redaction():
    r = Redactor(
        environ={
            "MY_API_KEY": "supersecretvalue123",
            "HOME": "/root",
            "SHORT_TOKEN": "abc",
            "GNOME_KEYRING_CONTROL": "/run/user/1000/keyring",
        }
    )
    text = (
        "key sk-proj-abcdefghijklmnopqrstuvwxyz0123 gh ghp_abcdefghijklmnopqrstuvwxyz0123456789 "
        "env supersecretvalue123 aws AKIAABCDEFGHIJKLMNOP hf hf_abcdefghijklmnopqrstuvwxyzABCDEF "
        "Authorization: Bearer abcdef0123456789abcdef home /root abc /run/user/1000/keyring"
    )
    out = r({"a": [text]})["a"][0]
    for secret in ("sk-proj", "ghp_", "supersecretvalue123", "AKIA", "hf_abc", "abcdef0123456789abcdef"):
        assert secret not in out
    assert out.count(REDACTED) == 6 and "/root" in out and " abc" in out and "/run/user/1000/keyring" in out
