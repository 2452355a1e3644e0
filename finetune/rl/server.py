"""The rollout server: what the orchestrator samples from and the weight push updates.

Anything that speaks token ids in, token ids + logprobs + weight version out, and takes weight updates without
restarting, is a rollout server (`RolloutServer`). Two implementations:

- `InProcessServer` (the default: no server to start): our engine (serve.engine.LLMEngine) on a background
  thread, serving a copy of the policy. Sessions call `generate` from their own threads; the engine thread
  batches every request in flight (continuous batching), and applies weight updates between two engine
  steps, never during one, bumping the version that later tokens report. `gather(n)` admits the next n calls
  as one batch in session order (single-call sessions: rollouts independent of thread timing).
- `remote.HttpServer` / `remote.Router` (`--rollout-url`): `glm5 serve` or sglang over HTTP.

`stats()` reports the generated tokens and how long the server sat idle with nothing to generate (the
rollout-server idle time of rl_log.jsonl).
"""

from __future__ import annotations

import queue
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from serve.engine import EngineConfig, LLMEngine
from serve.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class GenParams:
    max_new_tokens: int
    temperature: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class Generated:
    ids: list[int]
    logprobs: list[float]
    version_start: int
    version_end: int
    finish_reason: str | None


class RolloutServer(Protocol):
    def generate(self, prompt_ids: list[int], params: GenParams, session: str) -> Generated: ...

    @property
    def version(self) -> int: ...

    def stats(self) -> dict: ...

    def close(self) -> None: ...


def _natural(name: str) -> list:
    """A session name's sort key with its numbers as numbers: g2-s0 before g10-s0."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


class InProcessServer:
    """An LLMEngine on `model` driven by a background thread. `model` is the engine's own copy of the policy
    (the weight push copies the trainer's tensors into it), or the trainer's model itself in a synchronous
    run, where nothing samples while the trainer steps (then the push only bumps the version)."""

    def __init__(self, model, tokenizer, max_model_len: int, max_num_seqs: int, seed: int = 0):
        # No prefix cache: every call is computed the same way whatever ran before it, so a rerun, a resumed
        # run and the async run with staleness 0 sample what the synchronous run samples.
        config = EngineConfig(
            max_num_seqs=max_num_seqs, max_model_len=max_model_len, seed=seed, enable_prefix_caching=False
        )
        self.engine = LLMEngine(model, tokenizer=tokenizer, config=config)
        self.max_model_len = max_model_len
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._pending: dict[str, tuple[Future, int]] = {}
        self._gather = 0  # gather(n): hold calls until n are here, then add them in session order
        self._held: list[tuple[str, str, list[int], SamplingParams, Future]] = []
        self._n = 0
        self._lock = threading.Lock()
        self._stop = False
        self._error: BaseException | None = None
        self.idle_s = 0.0
        self.generated_tokens = 0
        self._thread = threading.Thread(target=self._loop, name="glm5-rl-engine", daemon=True)
        self._thread.start()

    # -- session side

    @property
    def version(self) -> int:
        return self.engine.weights_version

    def set_version(self, version: int) -> None:
        """A resumed run's engine reports the trainer's version (the number of optimizer steps)."""
        self._call("version", version)

    def generate(self, prompt_ids: list[int], params: GenParams, session: str = "") -> Generated:
        fut: Future = Future()
        with self._lock:
            self._n += 1
            rid = f"rl-{self._n}"
        self._post(("add", rid, (list(prompt_ids), params, session), fut))
        return fut.result()

    def gather(self, n: int) -> None:
        """The next `n` calls reach the engine together, in session order, before its next step: for sessions
        that make one call each, all started at once (the completion env's), whose batch, and with it the
        engine's fp32 sums and so the rollout logprobs, must not depend on which thread posted first (a resumed
        run is then the interrupted one)."""
        self._call("gather", n)

    def update_tensors(self, named: dict | None) -> int:
        """Copy `named` tensors into the served model between two engine steps (None: the served model is the
        trainer's, changed in place) -> the new version."""
        return self._call("weights", named)

    def stats(self) -> dict:
        return {"idle_s": self.idle_s, "generated_tokens": self.generated_tokens}

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)
        for *_, fut in self._held:  # a run stopped while a gathered batch was incomplete: its sessions end
            if not fut.done():
                fut.set_exception(RuntimeError("the rollout engine was closed"))
        self._held = []

    def _call(self, kind: str, payload):
        fut: Future = Future()
        self._post((kind, None, payload, fut))
        return fut.result()

    def _post(self, cmd) -> None:
        if self._error is not None:
            raise RuntimeError(f"the rollout engine failed: {self._error!r}")
        self._commands.put(cmd)
        self._wake.set()

    # -- engine thread

    def _drain(self) -> None:
        while True:
            try:
                kind, rid, payload, fut = self._commands.get_nowait()
            except queue.Empty:
                self._admit()
                return
            try:
                if kind == "add":
                    ids, p, session = payload
                    sp = SamplingParams(
                        max_tokens=max(1, min(p.max_new_tokens, self.max_model_len - len(ids))),
                        temperature=p.temperature,
                        seed=p.seed,
                        skip_special_tokens=False,
                    )
                    if len(ids) >= self.max_model_len:
                        raise ValueError(f"the prompt ({len(ids)} tokens) fills the context ({self.max_model_len})")
                    self._held.append((session, rid, ids, sp, fut))
                elif kind == "gather":
                    self._gather = int(payload)
                    fut.set_result(self._gather)
                elif kind == "weights":
                    fut.set_result(
                        self.engine.weights_changed() if payload is None else self.engine.update_weights(payload)
                    )
                elif kind == "version":
                    self.engine.weights_version = int(payload)
                    fut.set_result(self.engine.weights_version)
            except Exception as e:  # noqa: BLE001 - the caller gets its own error
                fut.set_exception(e)
                if kind == "add" and self._gather:  # a call refused here never joins the gathered batch
                    self._gather -= 1

    def _admit(self) -> None:
        """Held calls into the engine: at once, or, while gathering, once `gather`'s n are here (sorted)."""
        if not self._held or len(self._held) < self._gather:
            return
        held = sorted(self._held, key=lambda h: _natural(h[0])) if self._gather else self._held
        self._held, self._gather = [], 0
        for _, rid, ids, sp, fut in held:
            try:
                self.engine.add_request(ids, sp, request_id=rid)
                self._pending[rid] = (fut, self.engine.weights_version)
            except Exception as e:  # noqa: BLE001 - the caller gets its own error
                fut.set_exception(e)

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._drain()
                if not self.engine.has_unfinished:
                    t0 = time.monotonic()
                    self._wake.wait(0.05)
                    self._wake.clear()
                    self.idle_s += time.monotonic() - t0
                    continue
                for out in self.engine.step():
                    if out.finished:
                        fut, v0 = self._pending.pop(out.request_id)
                        self.generated_tokens += len(out.token_ids)
                        fut.set_result(
                            Generated(
                                list(out.token_ids),
                                [float(lp.logprob) for lp in out.logprobs],
                                v0,
                                self.engine.weights_version,
                                out.finish_reason,
                            )
                        )
        except BaseException as e:  # noqa: BLE001 - every waiting session hears of it
            self._error = e
            for fut in [f for f, _ in self._pending.values()] + [h[-1] for h in self._held]:
                fut.set_exception(RuntimeError(f"the rollout engine failed: {e!r}"))
            self._held = []
