"""Server settings: what the HTTP app is told at startup (not the engine's knobs, which live in EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def check_api_key(api_key: str | None) -> None:
    """An empty key is refused, not read as "no key": `--api-key ''` or an empty GLM5_API_KEY would otherwise
    serve without auth while its operator believes it is protected."""
    if api_key is not None and not api_key.strip():
        raise ValueError(
            "the API key is empty (--api-key '' or an empty GLM5_API_KEY): give a non-empty key, "
            "or unset it to serve without one"
        )


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    # Requests (each choice of `n` counts) the app lets into the engine at once: running plus waiting. Past it, 429.
    max_in_flight: int = 256
    # Thinking is on by default in GLM-5 (`chat_template_kwargs.enable_thinking` turns it off per request).
    enable_thinking: bool = True
    # A warm-up generation must succeed before /health says 200.
    warmup: bool = True
    warmup_timeout_s: float = 600.0
    health_generate_timeout_s: float = 30.0
    max_n: int = 16
    # Request bodies past this get 413 before they are read whole (`glm5 serve --max-body-mb`).
    max_body_bytes: int = 32 * 2**20
    # One line per request on the `glm5.access` logger (`glm5 serve --no-access-log` turns it off).
    access_log: bool = True
    # The checkpoint's own chat template (serve/http/template.JinjaTemplate) when it is not GLM-5's shipped one;
    # None renders with model/chat.py.
    chat_template: Any = None
    max_top_logprobs: int = 20
    # Bound to a loopback address (the default): only requests addressed to a loopback name (Host), and from no
    # page but a loopback one (Origin), are served. A web page the user visits could otherwise POST to
    # 127.0.0.1 (a `text/plain` body needs no CORS preflight) or reach it through DNS rebinding, and load weights.
    loopback_only: bool = False

    def __post_init__(self) -> None:
        check_api_key(self.api_key)
