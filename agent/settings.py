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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from agent import own_files
from agent.config_dir import config_dir
from agent.profiles import PROFILES

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
        from agent.sandbox import SandboxLimits

        return SandboxLimits(**dict(self.sandbox_limits)) if self.sandbox_limits else None


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"[agent] seed = {value!r}: expected a whole number >= 0")
    return value


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
    from agent import trust

    flags = {k: v for k, v in (flags or {}).items() if v is not None}
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
    profile = flags.get("profile") or env.get("GLM5_AGENT_PROFILE") or a.get("profile", "full")
    if profile not in PROFILES:
        raise SettingsError(f"agent profile {profile!r} is not one of {', '.join(PROFILES)} ([agent] profile)")
    terminal = flags.get("terminal")
    if terminal is None and env.get("GLM5_AGENT_TERMINAL"):
        words = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
        terminal = words.get(env["GLM5_AGENT_TERMINAL"].strip().lower(), env["GLM5_AGENT_TERMINAL"])
    terminal = a.get("terminal") if terminal is None else terminal
    if terminal is not None and not isinstance(terminal, bool):
        raise SettingsError(f"[agent] terminal (GLM5_AGENT_TERMINAL) must be true or false, not {terminal!r}")
    sb = data.get("sandbox") or {}
    for key in ("env", "pass_env"):
        if key in sb and not isinstance(sb[key], dict if key == "env" else list):
            raise SettingsError(f"[sandbox] {key} must be a {'table' if key == 'env' else 'list of names'}")
    try:
        sandbox_limits = tuple((k, int(sb[k])) for k in _LIMIT_KEYS if sb.get(k) is not None)
    except (TypeError, ValueError) as e:
        raise SettingsError(f"[sandbox] limits must be whole numbers: {e}") from None
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
        seed=_seed(a.get("seed")),
        send_reasoning=bool(a.get("send_reasoning", True)),
        profile=profile,
        terminal=terminal,
        sources=tuple(sources),
        env={str(k): str(v) for k, v in (sb.get("env") or {}).items()},
        pass_env=tuple(str(n) for n in sb.get("pass_env") or ()),
        sandbox_limits=sandbox_limits,
        trusted=trusted,
        ignored=tuple(dict.fromkeys(ignored)),
    )


def save_rule(rule: str, kind: str = "allow", scope: str = "repo", root: Path | None = None) -> Path:
    """Append a permission rule to the repository's `.glm5/settings.local.toml` (scope "repo"; the rule is also
    remembered in the user's trusted list, so it applies while the folder is untrusted) or to the user's
    config.toml (scope "user"). The rule is checked first; the file's other content is kept as it is."""
    from agent import trust
    from agent.permissions import Rule

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
    import json
    import re

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
