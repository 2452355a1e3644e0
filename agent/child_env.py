"""The environment a child command gets: an allowlist of the host's variables, never keys or secrets.

A model-written command (or a repository's test script) must not read the API key glm5 talks to the model with,
nor the user's cloud credentials, so children do not inherit the agent's environment. They get the variables a
toolchain needs (PATH, HOME, locale, terminal, the active virtual environment / toolchain homes), minus any
whose name looks secret, plus what the user's settings add (`[sandbox] env = {...}` values and `pass_env =
[names]`). Codex's `shell_environment_policy` does the same.
"""

from __future__ import annotations

import os
import re

from agent.redact import URL_PASSWORD

ALLOWED = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "COLORTERM", "NO_COLOR", "TZ",
    "TMPDIR", "PWD", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED", "PYTHONHASHSEED", "JAVA_HOME", "GOPATH", "GOROOT", "GOCACHE", "CARGO_HOME", "RUSTUP_HOME",
    "NODE_PATH", "NVM_DIR", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PIP_INDEX_URL", "UV_CACHE_DIR",
    "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "DISPLAY", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CI",
)  # fmt: skip
ALLOWED_PREFIXES = ("LC_",)
# Names that look like they hold a secret: never passed on from the host, whatever the allowlist says.
SECRET_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|_PAT$)")


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def scrubbed_env(
    extra: dict[str, str] | None = None,
    pass_env: tuple[str, ...] | list[str] = (),
    environ: dict[str, str] | None = None,
) -> dict[str, str]:
    """The allowlisted host variables (never secret-named ones, never an index URL with credentials in it),
    then `pass_env` names copied from the host as the user asked, then `extra` values as given."""
    src = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for k, v in src.items():
        if (k in ALLOWED or k.startswith(ALLOWED_PREFIXES)) and not looks_secret(k) and not _has_userinfo(v):
            out[k] = v
    for k in pass_env:
        if k in src:
            out[k] = src[k]
    out.update({k: str(v) for k, v in (extra or {}).items()})
    out.setdefault("PATH", os.defpath)
    return out


def _has_userinfo(value: str) -> bool:
    """`https://user:pass@host/...` (a pip index URL, say) carries a password."""
    return URL_PASSWORD.search(value) is not None
