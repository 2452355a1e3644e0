"""Rollout servers over HTTP: `glm5 serve` or sglang, with sglang's native routes exactly as sglang defines them
(checked against sglang's own request classes: tests/serve/test_engine_contracts.py).

- `/generate` {input_ids, sampling_params: {max_new_tokens, temperature, sampling_seed}, return_logprob: true,
  lora_path: the adapter of the trainer's version} -> output_ids, meta_info.output_token_logprobs ([logprob, id]
  pairs) and meta_info.weight_version;
- the weight push, in sglang's documented order (sglang_for_rl.md: pause_generation -> update weights ->
  continue_generation): a LoRA adapter is loaded under a name per version, `glm5-rl-v{N}` (sglang refuses a name
  already loaded), and every later /generate names it (sglang samples the base model for a request that names no
  adapter); older adapters are unloaded once no request of ours still runs on them (pause mode `in_place`: those
  finish on the adapter they started with). Full weights go through `/update_weights_from_disk` with the version as
  its `weight_version` label (pause mode `retract`). Every request carries the API key when one is given.

Versions are the trainer's (its optimizer steps). Which weights sampled a call: a server that reports its own count
for a push (`glm5 serve` answers each with its `weight_version`) is translated through that (weight_version_first /
weight_version: the first and last token's weights; `glm5 serve` serves one adapter at a time, to every request).
sglang's LoRA pushes report no version and its label is not the adapter a request named, so there the call's
version is that of the adapter it named, which sglang applies to the whole request. `Router` spreads sessions over
several servers by consistent hashing (GLM-5's DP-aware routing): every call of a session goes to the same replica,
whose prefix cache then holds the session's earlier turns; a push goes to all of them.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections import Counter

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
        self._reports = False  # whether the server's weight_version numbers follow our pushes (see the docstring)
        self._lock = threading.Lock()
        self.adapter: tuple[str, int] | None = None  # (name, trainer version) every new request names
        self._on_adapter: Counter = Counter()  # adapter name -> our requests running on it
        self._loaded: list[str] = []  # adapters we loaded and have not unloaded, oldest first
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
        try:
            return r.json()
        except ValueError:
            raise ServerFailure(f"{self.url}{path} answered 200 with a body that is not JSON: {r.text[:200]}") from None

    def generate(self, prompt_ids: list[int], params: GenParams, session: str = "") -> Generated:
        with self._lock:
            if self._inflight == 0:
                self.idle_s += time.monotonic() - self._idle_since
            self._inflight += 1
            v0, adapter = self._version, self.adapter
            if adapter is not None:
                self._on_adapter[adapter[0]] += 1
        try:
            sampling = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature}
            if params.seed is not None:
                sampling["sampling_seed"] = params.seed
            body = {"input_ids": list(prompt_ids), "sampling_params": sampling, "return_logprob": True}
            if adapter is not None:
                body["lora_path"] = adapter[0]
            out = self._post("/generate", body)
        finally:
            with self._lock:
                self._inflight -= 1
                if self._inflight == 0:
                    self._idle_since = time.monotonic()
                if adapter is not None:
                    self._on_adapter[adapter[0]] -= 1
        meta = out.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs") or []
        ids = list(out.get("output_ids") or [p[1] for p in pairs])
        if adapter is not None:
            v0 = adapter[1]
        last = _int(meta.get("weight_version"), None) if self._reports else None
        first = _int(meta.get("weight_version_first"), last) if self._reports else None
        v_end = last - self._offset if last is not None else v0
        v_start = min(v0, first - self._offset) if first is not None else v0
        self.generated_tokens += len(ids)
        reason = meta.get("finish_reason")
        finish = reason.get("type") if isinstance(reason, dict) else None
        return Generated(ids, [float(p[0]) for p in pairs], v_start, v_end, finish)

    def _pushed(self, out, version: int, label: str | None = None) -> int:
        reported = _int(out.get("weight_version"), None) if isinstance(out, dict) else None
        if label is not None:  # the server takes our label (update_weights_from_disk): its reports are ours
            reported = _int(label, None)
        self._reports = reported is not None
        self._offset = reported - version if reported is not None else 0
        self._version = version
        return version

    def _paused(self, mode: str, push):
        """Run `push()` between /pause_generation and /continue_generation; continue whatever happens."""
        self._post("/pause_generation", {"mode": mode})
        try:
            return push()
        finally:
            self._post("/continue_generation", {})

    def load_lora_adapter(self, name: str, path: str, version: int) -> int:
        versioned = f"{name}-v{version}"
        body = {"lora_name": versioned, "lora_path": path}

        def load() -> dict:
            try:
                return self._post("/load_lora_adapter", body)
            except ServerFailure as e:
                if "already exists" not in str(e):
                    raise
            # Left on the server by an earlier run of ours (a resumed run pushes its version again): replace it.
            self._post("/unload_lora_adapter", {"lora_name": versioned})
            return self._post("/load_lora_adapter", body)

        out = self._paused("in_place", load)
        if versioned in self._loaded:
            self._loaded.remove(versioned)
        with self._lock:
            self._loaded.append(versioned)
            self.adapter = (versioned, version)
            stale = [n for n in self._loaded[:-1] if self._on_adapter[n] <= 0]
        for old in stale:  # no request of ours runs on it any more; later pushes retry the others
            self._post("/unload_lora_adapter", {"lora_name": old})
            with self._lock:
                self._loaded.remove(old)
        return self._pushed(out, version)

    def update_weights_from_disk(self, path: str, version: int) -> int:
        body = {"model_path": path, "weight_version": str(version)}
        out = self._paused("retract", lambda: self._post("/update_weights_from_disk", body))
        with self._lock:
            self.adapter = None  # the checkpoint is the policy now; no request names an adapter
        return self._pushed(out, version, label=str(version))

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
