"""Secret redaction for everything glm5 writes: trajectories, saved command output.

Trajectories become training data and get shared, so API keys must not survive in them. Three nets:
- token formats that are recognisable on their own (OpenAI/Anthropic `sk-`, GitHub, GitLab, Slack, AWS, Google,
  Hugging Face, bearer headers, PEM private keys, the password in a URL's `user:password@`);
- assignments whose name looks secret, `.env` / shell / YAML / JSON style (`DB_PASSWORD=hunter2hunter2`,
  `aws_secret_access_key = ...`, `"api_key": "..."`): the value goes, the name stays; a value must look like a
  literal (quoted, or holding a digit) so code such as `token = self.next()` or `max_tokens = 100` is left alone;
- the values of environment variables whose names look secret (`*KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`,
  `*CREDENTIAL*`), wherever those values appear.

Token-level data is redacted on the assembled text, not token by token: a secret split over two logprob tokens
(`sk-` + `proj...`) is found in their concatenation and every token it touches is replaced. Token ids cannot be
redacted (they would decode back to the secret), so a response whose text needed redaction loses its
`token_ids`, and once a secret has been seen in a session (it is then in later prompts) `prompt_token_ids` are
dropped too; `token_ids_dropped` records why.
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
]
# the password of a URL's credentials, `https://user:PASSWORD@host` (a git remote in .git/config, a database URL)
URL_PASSWORD = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@'\"]*:([^\s/@'\"]+)@")
_BEARER = re.compile(r"(?i)\b(?:bearer|token)\s+([A-Za-z0-9_\-\.=/+]{16,})")
_SECRET_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSW|CREDENTIAL)")
# NAME = value, NAME: value, "name": "value", export NAME='value'
_ASSIGN = re.compile(
    r"""(?<![A-Za-z0-9_])(["']?)([A-Za-z_][A-Za-z0-9_.\-]*)\1[ \t]*(?:=|:)[ \t]*(["']?)([^\s"'`,;(){}\[\]<>]{6,})\3"""
)
_SECRET_WORD = re.compile(
    r"(?i)(?:^|[_.\-])(api_?key|apikey|key|secret|secret_?key|token|password|passwd|pass|pwd|credentials?|auth|"
    r"access_?key|private_?key|client_?secret)$"
)
_NOT_SECRET_VALUES = {"true", "false", "null", "none", "yes", "no", "required", "optional", "changeme"}


def secret_env_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables named like secrets, longest first (so substrings do not win)."""
    env = os.environ if environ is None else environ
    # values that are paths (SSH_AUTH_SOCK-like, KEYRING dirs) are not secrets and would blank out real paths
    vals = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 8 and not v.startswith(("/", "~"))}
    return sorted(vals, key=len, reverse=True)


def _assignment_spans(s: str) -> list[tuple[int, int]]:
    out = []
    for m in _ASSIGN.finditer(s):
        name, quote, value = m.group(2), m.group(3), m.group(4)
        if not _SECRET_WORD.search(name.replace("-", "_")):
            continue
        if value.lower() in _NOT_SECRET_VALUES or value.startswith(("$", "%", "/", "http")) or value.isdigit():
            continue
        if not quote and not any(c.isdigit() for c in value):
            continue  # `token = self.next`: code, not a literal
        if value == REDACTED:
            continue
        out.append((m.start(4), m.end(4)))
    return out


class Redactor:
    def __init__(self, extra_values: list[str] | None = None, environ: dict[str, str] | None = None):
        self.values = sorted(set(secret_env_values(environ)) | set(extra_values or []), key=len, reverse=True)
        self.seen = False  # a secret was redacted in this session: later prompts hold it too

    def spans(self, s: str) -> list[tuple[int, int]]:
        """Where the secrets are in `s`, merged, in order."""
        found: list[tuple[int, int]] = []
        for v in self.values:
            start = s.find(v)
            while start >= 0:
                found.append((start, start + len(v)))
                start = s.find(v, start + 1)
        for p in _PATTERNS:
            found += [(m.start(), m.end()) for m in p.finditer(s)]
        found += [(m.start(1), m.end(1)) for p in (_BEARER, URL_PASSWORD) for m in p.finditer(s)]
        found += _assignment_spans(s)
        merged: list[tuple[int, int]] = []
        for a, b in sorted(found):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def text(self, s: str) -> str:
        spans = self.spans(s)
        if not spans:
            return s
        self.seen = True
        out, last = [], 0
        for a, b in spans:
            out += [s[last:a], REDACTED]
            last = b
        out.append(s[last:])
        return "".join(out)

    def tokens(self, items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
        """Logprob entries ({"token", "bytes", "top_logprobs", ...}) with every token that overlaps a secret of the
        assembled text replaced; True when one was."""
        texts = [str(it.get("token", "")) for it in items]
        spans = self.spans("".join(texts))
        if not spans:
            return [self._plain(it) for it in items], False
        self.seen = True
        out, pos = [], 0
        for it, t in zip(items, texts, strict=True):
            a, b = pos, pos + len(t)
            pos = b
            if any(x < b and a < y for x, y in spans) or (a == b and any(x <= a < y for x, y in spans)):
                out.append({**it, "token": REDACTED, "bytes": None, "top_logprobs": []})
            else:
                out.append(self._plain(it))
        return out, True

    def _plain(self, it: Any) -> Any:
        return self(it)

    def __call__(self, obj: Any) -> Any:
        """Redact every string inside a JSON-like object (dict keys are left alone)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return self._dict(obj)
        if isinstance(obj, list | tuple):
            return [self(v) for v in obj]
        return obj

    def _dict(self, obj: dict[str, Any]) -> dict[str, Any]:
        before = self.seen
        self.seen = False
        out: dict[str, Any] = {}
        for k, v in obj.items():
            lp_content = isinstance(v, dict) and isinstance(v.get("content"), list)
            if k == "logprobs" and lp_content and all(isinstance(t, dict) for t in v["content"]):
                content, _ = self.tokens(v["content"])
                out[k] = {**self._dict({kk: vv for kk, vv in v.items() if kk != "content"}), "content": content}
            else:
                out[k] = self(v)
        here = self.seen
        self.seen = before or here
        if here and out.get("token_ids") is not None:
            out["token_ids"] = None
            out["token_ids_dropped"] = "the text held a secret that the ids would decode back to"
        if self.seen and out.get("prompt_token_ids") is not None:
            out["prompt_token_ids"] = None
            out["token_ids_dropped"] = "the session's prompts held a redacted secret"
        return out
