"""Which trajectories this machine recorded: a keyed hash chained through every record.

A repository can commit `.glm5/sessions/*.jsonl`; a bench run folder can come from anywhere. Text in them must
not be trained on (`glm5 finetune sft`) or resumed as the latest session (`glm5 code --continue`) as if the user
had recorded it. Every record TrajectoryWriter writes carries `mac`: HMAC-SHA256, under a key kept in the
user's config folder (created on first use, mode 0600, masked inside the sandbox), of the previous record's mac
and this record's canonical JSON. `verified_prefix` says how many leading records carry a valid chain: all of
them for a file this machine wrote, 0 for one it did not, fewer when lines were appended or edited since.
What it does not prove: that the user meant the session as training data, or that what the model said in it
was true; only that glm5 on this machine (under this config folder) wrote it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from agent.config_dir import config_dir

KEY_FILE = "provenance.key"
_lock = threading.Lock()
_keys: dict[Path, bytes] = {}


def key_path() -> Path:
    return config_dir() / KEY_FILE


def machine_key() -> bytes:
    """The key, made on first use (32 random bytes, readable by this user alone)."""
    path = key_path()
    with _lock:
        if path in _keys:
            return _keys[path]
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            text = f.read(200).strip()
        if len(text) < 32:
            raise OSError(f"{path}: the provenance key is too short; delete it to make a new one")
        _keys[path] = text.encode()
        return _keys[path]


def _canonical(record: dict[str, Any]) -> bytes:
    body = {k: v for k, v in record.items() if k != "mac"}
    return json.dumps(body, sort_keys=True, ensure_ascii=False, default=str).encode()


def seal(prev: str, record: dict[str, Any]) -> str:
    """The mac of `record` following a record whose mac is `prev` ("" for the first)."""
    return hmac.new(machine_key(), prev.encode() + b"\0" + _canonical(record), hashlib.sha256).hexdigest()[:40]


def mark(data: bytes) -> str:
    """This machine's mark of `data` (a run folder's settings and data: finetune/run_dir.py)."""
    return hmac.new(machine_key(), b"glm5-file\0" + data, hashlib.sha256).hexdigest()


def has_mark(data: bytes, claimed: str) -> bool:
    return hmac.compare_digest(mark(data), claimed.strip())


def verified_prefix(records: list[dict[str, Any]]) -> int:
    """How many leading records carry this machine's chain."""
    prev = ""
    for i, r in enumerate(records):
        mac = r.get("mac") if isinstance(r, dict) else None
        if not isinstance(mac, str) or not hmac.compare_digest(mac, seal(prev, r)):
            return i
        prev = mac
    return len(records)


def last_mac(records: list[dict[str, Any]]) -> str:
    """Where a writer appending to these records continues the chain (the last verified record's mac)."""
    n = verified_prefix(records)
    return str(records[n - 1]["mac"]) if n else ""


def is_ours(records: list[dict[str, Any]]) -> bool:
    return bool(records) and verified_prefix(records) == len(records)
