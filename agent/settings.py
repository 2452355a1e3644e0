"""Settings: TOML files, environment and flags, merged into one frozen `Settings`.

Precedence (ARCHITECTURE.md): flags > environment `GLM5_*` > files > defaults. Files, later wins:
    $GLM5_CONFIG_DIR/config.toml  (default ~/.config/glm5/config.toml)   the user's, all repositories
    <repo>/.glm5/settings.toml                                           the repository's, shared in git
    <repo>/.glm5/settings.local.toml                                     the repository's, this machine only
Tables merge key by key; the permission rule lists and hooks are concatenated, so a repository can add rules
but never drop a global `deny`.

    provider = "local"                 # which [providers.*] entry to use
    [providers.local]
    base_url = "http://127.0.0.1:8000/v1"
    model = "glm-5"
    api_key_env = "GLM5_API_KEY"       # the *name* of the variable holding the key; keys never live in files
    context_window = 131072            # tokens; when absent, the server's /models max_model_len (else 131072)
    input_cost_per_mtok = 0.0          # USD per million tokens, for the cost display and the cost limit
    output_cost_per_mtok = 0.0
    extra_body = { logprobs = true }   # merged into every request body (token ids / logprobs for training)
    [agent]     max_steps, max_tokens, max_cost_usd, max_wall_s, compact_ratio, stream, temperature,
                send_reasoning (false: strip reasoning_content from the history sent back)
    [permissions] mode = "ask" | "accept-edits" | "plan" | "auto"; allow / ask / deny = ["bash(git push)", ...];
                additional_dirs = ["/abs/path"]
    [sandbox]   enabled = true, network = false
    [hooks]     PreToolUse = [{ matcher = "bash", command = "./check.sh" }], ...
    [mcp_servers.NAME]  command = "...", args = [...], env = {...}   or   url = "http://host/mcp"
    [sessions]  dir = "/somewhere"     # default <repo>/.glm5/sessions
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

MODES = ("ask", "accept-edits", "plan", "auto")

BUILTIN_PROVIDERS: dict[str, dict[str, Any]] = {
    "local": {"base_url": "http://127.0.0.1:8000/v1", "model": "glm-5", "api_key_env": "GLM5_API_KEY"},
    "zai": {
        "base_url": "https://api.z.ai/api/coding/paas/v4",
        "model": "glm-5",
        "api_key_env": "ZAI_API_KEY",
        "context_window": 200000,
    },
}


DEFAULT_CONTEXT_WINDOW = 131072


class SettingsError(ValueError):
    """A settings file or value is wrong; the message names the file and the key."""


@dataclass(frozen=True)
class Provider:
    name: str
    base_url: str
    model: str
    api_key_env: str | None = None
    context_window: int | None = None  # None: ask the server (`/models` max_model_len), else DEFAULT_CONTEXT_WINDOW
    input_cost_per_mtok: float = 0.0
    output_cost_per_mtok: float = 0.0
    extra_body: tuple[tuple[str, object], ...] = ()  # sent with every request, e.g. logprobs or return_token_ids

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def cost(self, usage: dict[str, Any]) -> float:
        p = usage.get("prompt_tokens") or 0
        c = usage.get("completion_tokens") or 0
        return (p * self.input_cost_per_mtok + c * self.output_cost_per_mtok) / 1e6


@dataclass(frozen=True)
class Limits:
    max_steps: int = 200  # model calls per user turn
    max_tokens: int | None = None  # prompt + completion tokens over the session
    max_cost_usd: float | None = None
    max_wall_s: float | None = None  # per user turn


@dataclass(frozen=True)
class Settings:
    provider: Provider
    limits: Limits = Limits()
    mode: str = "ask"
    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    additional_dirs: tuple[str, ...] = ()
    sandbox: bool = True
    network: bool = False
    hooks: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions_dir: str | None = None
    compact_ratio: float = 0.85  # compact when the last prompt used this share of the context window
    stream: bool = True
    temperature: float | None = None
    send_reasoning: bool = True
    sources: tuple[str, ...] = ()  # files that contributed, for `glm5 code --help`-style diagnostics


def config_dir() -> Path:
    d = os.environ.get("GLM5_CONFIG_DIR")
    return Path(d) if d else Path.home() / ".config" / "glm5"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from None


_LISTS = ("allow", "ask", "deny", "additional_dirs")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if k == "hooks" and isinstance(v, dict):
            hooks = {e: list(h) for e, h in (out.get("hooks") or {}).items()}
            for event, entries in v.items():
                hooks.setdefault(event, []).extend(entries if isinstance(entries, list) else [entries])
            out["hooks"] = hooks
        elif k == "permissions" and isinstance(v, dict):
            perms = dict(out.get("permissions") or {})
            for pk, pv in v.items():
                perms[pk] = list(perms.get(pk, [])) + list(pv) if pk in _LISTS else pv
            out["permissions"] = perms
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_settings(root: Path | None = None, flags: dict[str, Any] | None = None) -> Settings:
    """Resolve settings for a repository. `flags` holds only what the user passed (None values are ignored)."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    data: dict[str, Any] = {}
    sources = []
    files = [config_dir() / "config.toml"]
    if root is not None:
        files += [root / ".glm5" / "settings.toml", root / ".glm5" / "settings.local.toml"]
    for f in files:
        if f.is_file():
            data = _merge(data, _read_toml(f))
            sources.append(str(f))

    env = os.environ
    providers = {**{k: dict(v) for k, v in BUILTIN_PROVIDERS.items()}}
    for name, p in (data.get("providers") or {}).items():
        if not isinstance(p, dict):
            raise SettingsError(f"[providers.{name}] must be a table")
        providers[name] = {**providers.get(name, {}), **p}
    pname = flags.get("provider") or env.get("GLM5_PROVIDER") or data.get("provider") or "local"
    if pname not in providers:
        raise SettingsError(
            f"unknown provider {pname!r}; known: {', '.join(sorted(providers))} (add [providers.{pname}])"
        )
    p = dict(providers[pname])
    for key in ("base_url", "model", "api_key_env"):
        v = flags.get(key) or env.get(f"GLM5_{key.upper()}")
        if v:
            p[key] = v
    if not p.get("base_url") or not p.get("model"):
        raise SettingsError(f"provider {pname!r} needs base_url and model")
    try:
        provider = Provider(
            name=pname,
            base_url=str(p["base_url"]),
            model=str(p["model"]),
            api_key_env=p.get("api_key_env"),
            context_window=int(p["context_window"]) if p.get("context_window") is not None else None,
            input_cost_per_mtok=float(p.get("input_cost_per_mtok", 0.0)),
            output_cost_per_mtok=float(p.get("output_cost_per_mtok", 0.0)),
            extra_body=tuple(sorted((p.get("extra_body") or {}).items())),
        )
    except (TypeError, ValueError) as e:
        raise SettingsError(f"[providers.{pname}]: {e}") from None

    a = data.get("agent") or {}
    limits = Limits(
        max_steps=int(flags.get("max_turns") or a.get("max_steps", 200)),
        max_tokens=a.get("max_tokens"),
        max_cost_usd=flags.get("max_cost_usd", a.get("max_cost_usd")),
        max_wall_s=a.get("max_wall_s"),
    )
    perms = data.get("permissions") or {}
    mode = flags.get("mode") or env.get("GLM5_PERMISSION_MODE") or perms.get("mode", "ask")
    if mode not in MODES:
        raise SettingsError(f"permission mode {mode!r} is not one of {', '.join(MODES)}")
    sb = data.get("sandbox") or {}
    hooks = {e: tuple(h) for e, h in (data.get("hooks") or {}).items()}
    sessions_dir = flags.get("sessions_dir") or env.get("GLM5_SESSIONS_DIR") or (data.get("sessions") or {}).get("dir")
    return Settings(
        provider=provider,
        limits=limits,
        mode=mode,
        allow=tuple(perms.get("allow", [])) + tuple(flags.get("allow", ())),
        ask=tuple(perms.get("ask", [])),
        deny=tuple(perms.get("deny", [])) + tuple(flags.get("deny", ())),
        additional_dirs=tuple(perms.get("additional_dirs", [])),
        sandbox=bool(flags.get("sandbox", sb.get("enabled", True))),
        network=bool(sb.get("network", False)),
        hooks=hooks,
        mcp_servers=dict(data.get("mcp_servers") or {}),
        sessions_dir=sessions_dir,
        compact_ratio=float(a.get("compact_ratio", 0.85)),
        stream=bool(a.get("stream", True)),
        temperature=a.get("temperature"),
        send_reasoning=bool(a.get("send_reasoning", True)),
        sources=tuple(sources),
    )
