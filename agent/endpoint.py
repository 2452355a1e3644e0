"""The model endpoint before a session starts: where its URL came from, and whether anything listens there.

`origin` names the setting that chose the URL (the --base-url flag, $GLM5_BASE_URL, a [providers.NAME] table
in a settings file, or a built-in provider's default), so an error can say what to change. `check` tries a TCP
connection to a local endpoint (this machine: nothing to wait for) and returns what to tell the user when it is
refused; remote endpoints are left to the client's retries.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.config_dir import config_dir

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def origin(settings: Any, flag_base_url: str | None = None) -> str:
    """Which setting chose `settings.provider.base_url`."""
    p = settings.provider
    if flag_base_url:
        return "the --base-url flag"
    if os.environ.get("GLM5_BASE_URL"):
        return "$GLM5_BASE_URL"
    where = None
    for f in settings.sources:  # later files override earlier ones, as load_settings merges them
        try:
            data = tomllib.loads(Path(f).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            continue
        table = (data.get("providers") or {}).get(p.name)
        # equal to the effective URL: an untrusted repository's settings may name one that was not applied
        if isinstance(table, dict) and str(table.get("base_url", "")) == p.base_url:
            where = f"[providers.{p.name}] base_url in {f}"
    return where or f"the built-in provider {p.name!r} (no --base-url, $GLM5_BASE_URL or settings file set one)"


def check(base_url: str, came_from: str, timeout_s: float = 1.0) -> str | None:
    """None when the endpoint may be reached; else the error to show (a local one refused the connection)."""
    u = urlsplit(base_url)
    host = u.hostname or ""
    if host not in LOCAL_HOSTS:
        return None
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection(("127.0.0.1" if host == "0.0.0.0" else host, port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        pass
    except OSError:
        return None  # a timeout or another error: let the client's retries and their message handle it

    return (
        f"no model server at {base_url} (connection to {host}:{port} refused). The URL came from {came_from}.\n"
        f"Start one with `glm5 serve CHECKPOINT --port {port}`, or point glm5 code at a running one with "
        f"--base-url URL, $GLM5_BASE_URL, or base_url under [providers.NAME] in {config_dir() / 'config.toml'} "
        "(--provider NAME picks a configured one)."
    )
