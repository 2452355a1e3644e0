"""Secret redaction for everything written to a trajectory.

Trajectories become training data and get shared, so API keys must not survive in them. Two nets:
- token formats that are recognisable on their own (OpenAI/Anthropic `sk-`, GitHub, GitLab, Slack, AWS, Google,
  Hugging Face, bearer headers, PEM private keys);
- the values of environment variables whose names look secret (`*KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`,
  `*CREDENTIAL*`), wherever those values appear.
"""

from __future__ import annotations

import os
import re
from typing import Any

REDACTED = "[REDACTED]"

_PATTERNS = [
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
    re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
    re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9_\-\.=]{16,}"),
]
_SECRET_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSW|CREDENTIAL)")


def secret_env_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables named like secrets, longest first (so substrings do not win)."""
    env = os.environ if environ is None else environ
    # values that are paths (SSH_AUTH_SOCK-like, KEYRING dirs) are not secrets and would blank out real paths
    vals = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 8 and not v.startswith(("/", "~"))}
    return sorted(vals, key=len, reverse=True)


class Redactor:
    def __init__(self, extra_values: list[str] | None = None, environ: dict[str, str] | None = None):
        self.values = sorted(set(secret_env_values(environ)) | set(extra_values or []), key=len, reverse=True)

    def text(self, s: str) -> str:
        for v in self.values:
            if v in s:
                s = s.replace(v, REDACTED)
        for p in _PATTERNS:
            if p.pattern.startswith("(?i)\\b(bearer)"):
                s = p.sub(lambda m: f"{m.group(1)} {REDACTED}", s)
            else:
                s = p.sub(REDACTED, s)
        return s

    def __call__(self, obj: Any) -> Any:
        """Redact every string inside a JSON-like object (dict keys are left alone)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: self(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self(v) for v in obj]
        return obj
