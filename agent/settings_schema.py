"""What each settings table accepts, checked by pydantic (as serve checks its requests), and the message that
names a wrong key.

    ProviderTable   [providers.NAME] once flags and GLM5_* are applied: base_url, model, api_key_env,
                    context_window, input / output_cost_per_mtok, extra_body
    AgentOptions    [agent] and the permission mode once flags and GLM5_* are applied: limits, compact_ratio,
                    stream, temperature, seed, send_reasoning, profile, terminal, mode
    SandboxTable    [sandbox]: enabled, network, env, pass_env, memory_mb / cpu_s / file_mb
    validated(model, values, where)  the model, or SettingsError naming the table and the key

Values are checked after precedence is resolved (a flag or the environment may replace a file's wrong value).
Unknown keys are ignored, as they always were. Knows nothing of files, trust or precedence: agent/settings.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from agent.profiles import PROFILES

MODES = ("ask", "accept-edits", "plan", "auto")


class SettingsError(ValueError):
    """A settings file or value is wrong; the message names the file and the key."""


class _Table(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ProviderTable(_Table):
    model_config = ConfigDict(extra="ignore", frozen=True, coerce_numbers_to_str=True)

    base_url: str
    model: str
    api_key_env: str | None = None
    context_window: int | None = None  # None: ask the server (`/models` max_model_len)
    input_cost_per_mtok: float = 0.0
    output_cost_per_mtok: float = 0.0
    extra_body: dict[str, Any] | None = None


class AgentOptions(_Table):
    # checked in this order, as they always were: the first wrong one is named
    max_steps: int = 200
    mode: str = "ask"
    profile: str = "full"
    terminal: bool | None = None
    max_tokens: int | float | None = None  # the number as written: int stays int
    max_cost_usd: float | int | None = None
    max_wall_s: float | int | None = None
    compact_ratio: float = 0.85
    stream: bool = True
    temperature: float | int | None = None
    seed: int | None = None
    send_reasoning: bool = True

    @field_validator("mode", "profile", "terminal", "seed", mode="before")
    @classmethod
    def _checked(cls, value: Any, info: ValidationInfo) -> Any:
        return _check(_AGENT_CHECKS, value, info)


class SandboxTable(_Table):
    enabled: bool = True
    network: bool = False
    env: dict[str, Any] = {}
    pass_env: list[Any] = []
    memory_mb: int | None = None
    cpu_s: int | None = None
    file_mb: int | None = None

    @field_validator("env", "pass_env", mode="before")
    @classmethod
    def _checked(cls, value: Any, info: ValidationInfo) -> Any:
        return _check(_SANDBOX_CHECKS, value, info)


# field -> (what a good value is, the message of a wrong one): the words users have always been shown
_AGENT_CHECKS = {
    "mode": (lambda v: v in MODES, "permission mode {!r} is not one of " + ", ".join(MODES)),
    "profile": (lambda v: v in PROFILES,
                "agent profile {!r} is not one of " + ", ".join(PROFILES) + " ([agent] profile)"),
    "terminal": (lambda v: v is None or isinstance(v, bool),
                 "[agent] terminal (GLM5_AGENT_TERMINAL) must be true or false, not {!r}"),
    "seed": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0),
             "[agent] seed = {!r}: expected a whole number >= 0"),
}  # fmt: skip
_SANDBOX_CHECKS = {
    "env": (lambda v: isinstance(v, dict), "[sandbox] env must be a table"),
    "pass_env": (lambda v: isinstance(v, list), "[sandbox] pass_env must be a list of names"),
}


def _check(checks: dict[str, tuple[Callable[[Any], bool], str]], value: Any, info: ValidationInfo) -> Any:
    good, message = checks[info.field_name]
    if not good(value):
        raise ValueError(message.format(value))
    return value


T = TypeVar("T", bound=BaseModel)


def validated(model: type[T], values: dict[str, Any], where: str) -> T:
    """`model` of `values`; a wrong value is a SettingsError: a validator's own message, else `where key = value:
    what is wrong` (`where` names the table: "[providers.local]")."""
    try:
        return model.model_validate(values)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        if err["type"] == "value_error":
            raise SettingsError(str(err["ctx"]["error"])) from None
        key = ".".join(str(p) for p in err["loc"])
        raise SettingsError(f"{where} {key} = {err.get('input')!r}: {err['msg']}") from None
