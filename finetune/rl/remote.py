"""Rollout servers over HTTP: `glm5 serve` or sglang, anything with sglang's native routes.

- `/generate` {input_ids, sampling_params, return_logprob: true} -> output_ids, meta_info.output_token_logprobs
  ([logprob, id] pairs) and meta_info.weight_version;
- `/load_lora_adapter` {lora_name, lora_path} and `/update_weights_from_disk` {model_path}: the weight push.

Versions are the trainer's (its optimizer steps). A server counts its own updates (`glm5 serve`: one per push;
a label where the push names one): after each push the client notes the server's number for the trainer's
version and translates what /generate reports (weight_version_first / weight_version: the first and last
token's weights). A server that reports none gets the version last pushed. `Router` spreads sessions over several
servers by consistent hashing (GLM-5's DP-aware routing): every call of a session goes to the same replica,
whose prefix cache then holds the session's earlier turns; a push goes to all of them.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time

import httpx

from finetune.rl.env import ServerFailure
from finetune.rl.server import Generated, GenParams


class HttpServer:
    def __init__(self, url: str, timeout_s: float = 600.0, api_key: str | None = None):
        self.url = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)
        self._version = 0
        self._offset = 0  # the server's version number minus the trainer's
        self._lock = threading.Lock()
        self.generated_tokens = 0
        self.busy_s = 0.0
        self._inflight = 0
        self._idle_since = time.monotonic()
        self.idle_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version

    def _post(self, path: str, body: dict) -> dict:
        try:
            r = self._http.post(path, json=body)
        except httpx.HTTPError as e:
            raise ServerFailure(f"{self.url}{path}: {e}") from None
        if r.status_code != 200:
            raise ServerFailure(f"{self.url}{path} answered {r.status_code}: {r.text[:500]}")
        return r.json()

    def generate(self, prompt_ids: list[int], params: GenParams, session: str = "") -> Generated:
        v0 = self._version
        with self._lock:
            if self._inflight == 0:
                self.idle_s += time.monotonic() - self._idle_since
            self._inflight += 1
        try:
            body = {
                "input_ids": list(prompt_ids),
                "sampling_params": {
                    "max_new_tokens": params.max_new_tokens,
                    "temperature": params.temperature,
                    "seed": params.seed,
                    "skip_special_tokens": False,
                },
                "return_logprob": True,
                "rid": None,
            }
            out = self._post("/generate", body)
        finally:
            with self._lock:
                self._inflight -= 1
                if self._inflight == 0:
                    self._idle_since = time.monotonic()
        meta = out.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs") or []
        ids = list(out.get("output_ids") or [p[1] for p in pairs])
        last = _int(meta.get("weight_version"), None)
        first = _int(meta.get("weight_version_first"), last)
        v_end = last - self._offset if last is not None else self._version
        v_start = min(v0, first - self._offset) if first is not None else v0
        self.generated_tokens += len(ids)
        reason = meta.get("finish_reason")
        finish = reason.get("type") if isinstance(reason, dict) else None
        return Generated(ids, [float(p[0]) for p in pairs], v_start, v_end, finish)

    def _pushed(self, out, version: int) -> int:
        reported = _int(out.get("weight_version"), None) if isinstance(out, dict) else None
        self._offset = reported - version if reported is not None else 0
        self._version = version
        return version

    def load_lora_adapter(self, name: str, path: str, version: int) -> int:
        # One name: the server replaces its adapter with the new weights (glm5 serve; sglang reloads by name).
        out = self._post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        return self._pushed(out, version)

    def update_weights_from_disk(self, path: str, version: int) -> int:
        out = self._post("/update_weights_from_disk", {"model_path": path, "weight_version": str(version)})
        return self._pushed(out, version)

    def stats(self) -> dict:
        idle = self.idle_s + (time.monotonic() - self._idle_since if self._inflight == 0 else 0.0)
        return {"idle_s": idle, "generated_tokens": self.generated_tokens}

    def close(self) -> None:
        self._http.close()


def _int(value, default):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Router:
    """Consistent hashing of session ids onto servers (64 points per server on a ring of sha1 hashes)."""

    def __init__(self, servers: list, points: int = 64):
        if not servers:
            raise ValueError("a router needs at least one server")
        self.servers = servers
        ring = sorted((_hash(f"{i}:{k}"), i) for i in range(len(servers)) for k in range(points))
        self._keys = [h for h, _ in ring]
        self._owners = [i for _, i in ring]

    def route(self, session: str) -> int:
        i = bisect.bisect(self._keys, _hash(session)) % len(self._keys)
        return self._owners[i]

    @property
    def version(self) -> int:
        return min(s.version for s in self.servers)

    def set_version(self, version: int) -> None:
        for s in self.servers:
            s.set_version(version)

    def generate(self, prompt_ids: list[int], params: GenParams, session: str = "") -> Generated:
        return self.servers[self.route(session)].generate(prompt_ids, params, session)

    def load_lora_adapter(self, name: str, path: str, version: int) -> int:
        return min(s.load_lora_adapter(name, path, version) for s in self.servers)

    def update_weights_from_disk(self, path: str, version: int) -> int:
        return min(s.update_weights_from_disk(path, version) for s in self.servers)

    def stats(self) -> dict:
        st = [s.stats() for s in self.servers]
        return {"idle_s": sum(x["idle_s"] for x in st), "generated_tokens": sum(x["generated_tokens"] for x in st)}

    def close(self) -> None:
        for s in self.servers:
            s.close()


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big")
