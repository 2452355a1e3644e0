"""Settings: TOML files, environment and flags, merged into one frozen `Settings`.

Precedence (ARCHITECTURE.md): flags > environment `GLM5_*` > files > defaults. Files, later wins:
    $GLM5_CONFIG_DIR/config.toml  (default ~/.config/glm5/config.toml)   the user's, all repositories
    <repo>/.glm5/settings.toml                                           the repository's, shared in git
    <repo>/.glm5/settings.local.toml                                     the repository's, this machine only
Tables merge key by key; the permission rule lists and hooks are concatenated, so a repository can add rules
but never drop a global `deny`. A repository's files are someone else's input: until the user trusts the folder
(agent/trust.py: the TUI's prompt, `--trust`, `trusted_folders` in the user's config) only what narrows applies
(deny / ask rules, a stricter mode, sandbox on, network off, limits); what widens is listed in
`Settings.ignored` and has no effect.

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
                seed (each request carries seed + its index in the session: reproducible sampling),
                send_reasoning (false: strip reasoning_content from the history sent back),
                profile = "full" | "compact" (agent/profiles.py: 4 tools and a short prompt, for small models),
                terminal = true | false (the terminal tools; default: in full, not in compact; GLM5_AGENT_TERMINAL)
    [permissions] mode = "ask" | "accept-edits" | "plan" | "auto"; allow / ask / deny = ["bash(git push)", ...];
                additional_dirs = ["/abs/path"]
    [sandbox]   enabled = true, network = false, env = { NAME = "value" }, pass_env = ["NAME"] (variables
                commands get beyond the allowlist of agent/child_env.py), memory_mb, cpu_s, file_mb (limits)
    [hooks]     PreToolUse = [{ matcher = "bash", command = "./check.sh" }], ...
    [mcp_servers.NAME]  command = "...", args = [...], env = {...}   or   url = "http://host/mcp"
    [sessions]  dir = "/somewhere"     # default <repo>/.glm5/sessions
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from agent import own_files, trust
from agent.config_dir import config_dir
from agent.permissions import Rule
from agent.sandbox import SandboxLimits
from agent.settings_schema import (  # noqa: F401 - MODES and SettingsError are also read from here
    MODES,
    AgentOptions,
    ProviderTable,
    SandboxTable,
    SettingsError,
    validated,
)

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
    seed: int | None = None  # [agent] seed: each request of a session carries seed + its index (OpenAI's `seed`)
    send_reasoning: bool = True
    profile: str = "full"  # agent/profiles.py: full, or compact (4 tools, a short prompt) for small models
    terminal: bool | None = None  # the terminal tools offered (None: the profile's default, agent/profiles.py)
    sources: tuple[str, ...] = ()  # files that contributed, for `glm5 code --help`-style diagnostics
    env: dict[str, str] = field(default_factory=dict)  # [sandbox] env: set for every command
    pass_env: tuple[str, ...] = ()  # [sandbox] pass_env: host variables commands may see
    sandbox_limits: tuple[tuple[str, int], ...] = ()  # [sandbox] memory_mb / cpu_s / file_mb
    trusted: bool = True  # the repository's own settings were applied in full
    ignored: tuple[str, ...] = ()  # repository settings that would widen permissions, ignored until trusted

    @property
    def limits_for_sandbox(self):
        return SandboxLimits(**dict(self.sandbox_limits)) if self.sandbox_limits else None


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


STRICTNESS = {"auto": 0, "accept-edits": 1, "ask": 2, "plan": 3}
# an untrusted repository may not pick the model or its prices (the cost limit is counted in them)
_SAFE_PROVIDER_KEYS = ("context_window",)
_LIMIT_KEYS = ("memory_mb", "cpu_s", "file_mb")
AGENT_LIMITS = {"max_steps": 200, "max_tokens": None, "max_cost_usd": None, "max_wall_s": None}  # None: no limit


def _narrow_agent(v: dict[str, Any], user: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """[agent] of an untrusted repository: its limits only where they are at or below the user's."""
    out, ignored = {}, []
    for ak, av in v.items():
        if ak not in AGENT_LIMITS:
            out[ak] = av
            continue
        cap = user.get(ak, AGENT_LIMITS[ak])
        ok = isinstance(av, int | float) and not isinstance(av, bool) and av >= 0
        if ok and (cap is None or (isinstance(cap, int | float) and av <= cap)):
            out[ak] = av
        else:
            ignored.append(f"agent.{ak}")
    return out, ignored


def narrow(repo: dict[str, Any], user_mode: str, saved_rules: list[str] = (),
           user: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """The part of an untrusted repository's settings that only narrows, and the keys left out. `user`: the
    user's own settings so far (their [agent] limits are the caps)."""
    out: dict[str, Any] = {}
    ignored: list[str] = []
    for k, v in repo.items():
        if k == "agent" and isinstance(v, dict):
            out[k], left = _narrow_agent(v, (user or {}).get("agent") or {})
            ignored += left
        elif k == "providers" and isinstance(v, dict):
            for name, p in v.items():
                if not isinstance(p, dict):
                    continue
                keep = {pk: pv for pk, pv in p.items() if pk in _SAFE_PROVIDER_KEYS}
                ignored += [f"providers.{name}.{pk}" for pk in p if pk not in keep]
                if keep:
                    out.setdefault("providers", {})[name] = keep
        elif k == "permissions" and isinstance(v, dict):
            perms: dict[str, Any] = {}
            for pk, pv in v.items():
                if pk in ("deny", "ask"):
                    perms[pk] = pv
                elif pk == "allow":
                    kept = [r for r in pv if r in saved_rules]  # rules the user saved for this folder
                    if kept:
                        perms["allow"] = kept
                    if len(kept) < len(pv):
                        ignored.append("permissions.allow")
                elif pk == "mode" and STRICTNESS.get(pv, -1) >= STRICTNESS.get(user_mode, 2):
                    perms[pk] = pv
                else:
                    ignored.append(f"permissions.{pk}")
            out["permissions"] = perms
        elif k == "sandbox" and isinstance(v, dict):
            sb = {}
            for sk, sv in v.items():
                if (sk == "enabled" and sv is True) or (sk == "network" and sv is False):
                    sb[sk] = sv
                else:
                    ignored.append(f"sandbox.{sk}")
            out["sandbox"] = sb
        else:
            ignored.append(k)
    return out, ignored


def load_settings(
    root: Path | None = None, flags: dict[str, Any] | None = None, trusted: bool | None = None
) -> Settings:
    """Resolve settings for a repository. `flags` holds only what the user passed (None values are ignored);
    `flags["trust"]` (or `trusted`) applies the repository's own settings in full for this run."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    data, sources, ignored, trusted = _read_files(root, flags, trusted)
    env = os.environ
    provider = _provider(data, flags, env)
    a = _agent_options(data, flags, env)
    limits = Limits(max_steps=a.max_steps, max_tokens=a.max_tokens, max_cost_usd=a.max_cost_usd,
                    max_wall_s=a.max_wall_s)  # fmt: skip
    perms = data.get("permissions") or {}
    sb = validated(SandboxTable, data.get("sandbox") or {}, "[sandbox]")
    sandbox_limits = tuple((k, v) for k in _LIMIT_KEYS if (v := getattr(sb, k)) is not None)
    hooks = {e: tuple(h) for e, h in (data.get("hooks") or {}).items()}
    sessions_dir = flags.get("sessions_dir") or env.get("GLM5_SESSIONS_DIR") or (data.get("sessions") or {}).get("dir")
    return Settings(
        provider=provider,
        limits=limits,
        mode=a.mode,
        allow=tuple(perms.get("allow", [])) + tuple(flags.get("allow", ())),
        ask=tuple(perms.get("ask", [])),
        deny=tuple(perms.get("deny", [])) + tuple(flags.get("deny", ())),
        additional_dirs=tuple(perms.get("additional_dirs", [])),
        sandbox=bool(flags.get("sandbox", sb.enabled)),
        network=sb.network,
        hooks=hooks,
        mcp_servers=dict(data.get("mcp_servers") or {}),
        sessions_dir=sessions_dir,
        compact_ratio=a.compact_ratio,
        stream=a.stream,
        temperature=a.temperature,
        seed=a.seed,
        send_reasoning=a.send_reasoning,
        profile=a.profile,
        terminal=a.terminal,
        sources=tuple(sources),
        env={str(k): str(v) for k, v in sb.env.items()},
        pass_env=tuple(str(n) for n in sb.pass_env),
        sandbox_limits=sandbox_limits,
        trusted=trusted,
        ignored=tuple(dict.fromkeys(ignored)),
    )


def _read_files(root: Path | None, flags: dict[str, Any],
                trusted: bool | None) -> tuple[dict[str, Any], list[str], list[str], bool]:  # fmt: skip
    """The user's config.toml, then the repository's files (narrowed unless trusted), merged: (data, the files
    read, the repository's keys left out, whether the repository is trusted)."""
    data: dict[str, Any] = {}
    sources = []
    user_file = config_dir() / "config.toml"
    if user_file.is_file():
        data = _read_toml(user_file)
        sources.append(str(user_file))
    ignored: list[str] = []
    if trusted is None:
        trusted = bool(flags.get("trust")) or root is None or trust.is_trusted(root, data)
    if root is not None:
        user_mode = (data.get("permissions") or {}).get("mode", "ask")
        for f in (root / ".glm5" / "settings.toml", root / ".glm5" / "settings.local.toml"):
            if not f.is_file():
                continue
            repo_data = _read_toml(f)
            if not trusted:
                repo_data, left_out = narrow(repo_data, user_mode, trust.user_rules(root), data)
                ignored += [f"{f.name}: {k}" for k in left_out]
            data = _merge(data, repo_data)
            sources.append(str(f))
    return data, sources, ignored, trusted


def _provider(data: dict[str, Any], flags: dict[str, Any], env: Any) -> Provider:
    """The provider named by the flag, GLM5_PROVIDER or the files (built-in ones under them), with base_url,
    model and api_key_env from the flags or GLM5_* over its table."""
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
    t = validated(ProviderTable, p, f"[providers.{pname}]")
    return Provider(name=pname, base_url=t.base_url, model=t.model, api_key_env=t.api_key_env,
                    context_window=t.context_window, input_cost_per_mtok=t.input_cost_per_mtok,
                    output_cost_per_mtok=t.output_cost_per_mtok,
                    extra_body=tuple(sorted((t.extra_body or {}).items())))  # fmt: skip


def _agent_options(data: dict[str, Any], flags: dict[str, Any], env: Any) -> AgentOptions:
    """[agent] and the permission mode with the flags and GLM5_* over them, checked."""
    a = data.get("agent") or {}
    file_mode = (data.get("permissions") or {}).get("mode", "ask")
    terminal = flags.get("terminal")
    if terminal is None and env.get("GLM5_AGENT_TERMINAL"):
        words = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
        terminal = words.get(env["GLM5_AGENT_TERMINAL"].strip().lower(), env["GLM5_AGENT_TERMINAL"])
    values = {
        **a,
        "max_steps": flags.get("max_turns") or a.get("max_steps", 200),
        "max_cost_usd": flags.get("max_cost_usd", a.get("max_cost_usd")),
        "mode": flags.get("mode") or env.get("GLM5_PERMISSION_MODE") or file_mode,
        "profile": flags.get("profile") or env.get("GLM5_AGENT_PROFILE") or a.get("profile", "full"),
        "terminal": a.get("terminal") if terminal is None else terminal,
    }
    return validated(AgentOptions, values, "[agent]")


def save_rule(rule: str, kind: str = "allow", scope: str = "repo", root: Path | None = None) -> Path:
    """Append a permission rule to the repository's `.glm5/settings.local.toml` (scope "repo"; the rule is also
    remembered in the user's trusted list, so it applies while the folder is untrusted) or to the user's
    config.toml (scope "user"). The rule is checked first; the file's other content is kept as it is."""
    if kind not in ("allow", "ask", "deny"):
        raise SettingsError(f"rule kind {kind!r} is not one of allow, ask, deny")
    if scope not in ("repo", "user"):
        raise SettingsError(f"scope {scope!r} is not one of repo, user")
    try:
        Rule.parse(rule)
    except ValueError as e:
        raise SettingsError(str(e)) from None
    if scope == "repo":
        if root is None:
            raise SettingsError("save_rule(scope='repo') needs the repository root")
        # the repository's folder and file are the repository's: a link there (to the user's config.toml, say)
        # would be read into the file and replaced by it, or written through
        path = own_files.folder(root, ".glm5") / "settings.local.toml"
        own_files.check_not_link(path)
    else:
        path = config_dir() / "config.toml"
    data = _read_toml(path) if path.is_file() else {}
    perms = data.get("permissions") or {}
    rules = list(perms.get(kind) or [])
    if rule not in rules:
        rules.append(rule)
        _write_rules(path, kind, rules)
    if scope == "repo" and kind == "allow":
        trust.add_user_rule(Path(root), rule)
    return path


def _write_rules(path: Path, kind: str, rules: list[str]) -> None:
    """Rewrite only the `kind = [...]` line of [permissions] (adding the table or the line when missing), so the
    user's comments and layout elsewhere survive."""
    line = f"{kind} = {json.dumps(rules)}"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    m = re.search(r"(?ms)^\[permissions\]\s*$(.*?)(?=^\[|\Z)", text)
    if m is None:
        text = text + ("" if not text or text.endswith("\n") else "\n") + f"\n[permissions]\n{line}\n"
    else:
        body = m.group(1)
        km = re.search(rf"(?ms)^{kind}\s*=\s*\[.*?\]\s*$", body)
        body = body[: km.start()] + line + body[km.end() :] if km else "\n" + line + body
        text = text[: m.start(1)] + body + text[m.end(1) :]
    _read_toml_text(text, path)  # never leave a file that no longer parses
    path.parent.mkdir(parents=True, exist_ok=True)
    own_files.replace(path, text)  # a fresh temporary file renamed over it: never written through a link


def _read_toml_text(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: the rule could not be saved without breaking the file: {e}") from None
