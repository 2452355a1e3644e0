"""Which repositories the user trusts: only those may widen what the agent can do through their own settings.

A cloned repository is someone else's input. Its `.glm5/settings.toml` (and `settings.local.toml`, which a
repository can ship too) may always narrow: add deny / ask rules, choose a stricter mode, keep the sandbox on
and the network off. Everything that widens (allow rules, a looser mode, additional folders, the sandbox or
network switches, hooks and MCP servers, which run programs unsandboxed, the provider, base URL and API-key
variable, which decide where code and keys are sent, environment passed to commands, the sessions folder) is
ignored until the user trusts the folder: a trust prompt in the TUI, `glm5 code --trust`, or a folder listed
in the user's config. Claude Code and Codex do the same.

The trusted list lives in the user's config folder, never in a repository:
    $GLM5_CONFIG_DIR/trusted.json     {"folders": ["/abs/real/path", ...], "rules": {"/abs/path": ["bash(...)"]}}
    config.toml                       trusted_folders = ["/abs/path", ...]   (the same, written by hand)
Folders are compared by real path (links resolved), so a symlink to a trusted folder is that folder and a
folder's name alone trusts nothing. `rules` are the repository-scoped rules the user saved with "always allow":
they apply even while the folder is untrusted, because the user, not the repository, wrote them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agent.config_dir import config_dir


def _store() -> Path:
    return config_dir() / "trusted.json"


def _real(root: Path) -> str:
    return os.path.realpath(root)


def _load() -> dict[str, Any]:
    p = _store()
    if not p.is_file():
        return {"folders": [], "rules": {}}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {"folders": [], "rules": {}}  # a broken file trusts nothing
    return {"folders": list(data.get("folders") or []), "rules": dict(data.get("rules") or {})}


def _save(data: dict[str, Any]) -> None:
    p = _store()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, p)  # a crash leaves the old list, never half a file


def is_trusted(root: Path, user_config: dict[str, Any] | None = None) -> bool:
    real = _real(root)
    listed = list(_load()["folders"]) + list((user_config or {}).get("trusted_folders") or [])
    return any(_real(Path(f).expanduser()) == real for f in listed)


def trust_folder(root: Path) -> None:
    """Remember that the user trusts `root` (the TUI's trust prompt answers here)."""
    data = _load()
    real = _real(root)
    if real not in data["folders"]:
        data["folders"].append(real)
        _save(data)


def user_rules(root: Path) -> list[str]:
    """Rules the user saved for this repository ("always allow", scope repo)."""
    return list(_load()["rules"].get(_real(root), []))


def add_user_rule(root: Path, rule: str) -> None:
    data = _load()
    rules = data["rules"].setdefault(_real(root), [])
    if rule not in rules:
        rules.append(rule)
        _save(data)
