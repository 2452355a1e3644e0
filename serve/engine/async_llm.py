"""The engine for an asyncio server: a background thread steps the engine, each request is an async generator.

    engine = AsyncLLM(LLM(path).engine)
    async for out in engine.generate("hello", SamplingParams(max_tokens=8)):
        ...  # cumulative RequestOutput after each token; the last one has finish_reason set

Leaving the `async for` early (client disconnected, task cancelled) aborts the request and frees its
blocks. The engine itself is single-threaded: the asyncio side only posts commands (add, abort) to a
queue that the engine thread drains between steps, and results come back through
`loop.call_soon_threadsafe` into one asyncio.Queue per request.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import AsyncIterator

from serve.engine.engine import LLMEngine
from serve.engine.request_output import RequestOutput
from serve.engine.sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
    """The engine thread failed; requests in flight receive this."""


class AsyncLLM:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="glm5-engine", daemon=True)
        self._thread.start()

    # ---- asyncio side -------------------------------------------------------------------------------

    async def generate(
        self, prompt: str | list[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        if self._error is not None:
            raise EngineDeadError(f"the engine thread failed: {self._error!r}")
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        # Refused before `_streams` is touched: writing (and later popping) the entry, or aborting the id, would
        # silence or kill the request that already runs under it.
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already running")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        stream = (loop, q)
        self._streams[rid] = stream
        done = asyncio.get_running_loop().create_future()
        self._post(("add", rid, prompt, params or SamplingParams(), done))
        finished = refused = False
        try:
            try:
                await done  # raises the add error (bad prompt, too long) in the caller
            except Exception:
                refused = True  # never added: nothing of ours to abort, and the id may be another request's
                raise
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            # Only this call's own entry, never one another call holds under the same id.
            if self._streams.get(rid) is stream:
                del self._streams[rid]
            if not (finished or refused):
                self._post(("abort", rid, None, None, None))

    def abort(self, request_id: str) -> None:
        self._post(("abort", request_id, None, None, None))

    async def update_weights(self, state_dict: dict, low_rank: dict | None = None) -> int:
        """Swap weights between two engine steps (never during one); returns the new weights_version.
        `low_rank`: as `LLMEngine.update_weights`."""
        fut = asyncio.get_running_loop().create_future()
        self._post(("weights", None, (state_dict, low_rank), None, fut))
        return await fut

    def metrics(self):
        return self.engine.metrics()

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    def _post(self, cmd) -> None:
        self._commands.put(cmd)
        self._wake.set()

    # ---- engine thread ------------------------------------------------------------------------------

    def _deliver(self, rid: str, item) -> None:
        stream = self._streams.get(rid)
        if stream is not None:
            loop, q = stream
            loop.call_soon_threadsafe(q.put_nowait, item)

    @staticmethod
    def _resolve(fut, error: BaseException | None, result=None) -> None:
        def set_it():
            if fut.done():
                return
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)

        fut.get_loop().call_soon_threadsafe(set_it)

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, rid, prompt, params, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                try:
                    self.engine.add_request(prompt, params, request_id=rid)
                    self._resolve(fut, None)
                except Exception as e:  # bad request: reported to its caller, the engine goes on
                    self._resolve(fut, e)
            elif kind == "weights":
                try:
                    self._resolve(fut, None, self.engine.update_weights(*prompt))
                except Exception as e:
                    self._resolve(fut, e)
            elif kind == "abort":
                out = self.engine.abort(rid)
                if out is not None:
                    self._deliver(rid, out)

    def _loop(self) -> None:
        try:
            while not self._stopped:
                self._drain_commands()
                if not self.engine.has_unfinished:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
        except BaseException as e:  # noqa: BLE001 - every waiting request must hear about it
            self._error = e
            for rid in list(self._streams):
                self._deliver(rid, EngineDeadError(f"the engine thread failed: {e!r}"))
