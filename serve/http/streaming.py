"""Server-sent events and the interleaving of several generations (n choices, or a batch of prompts) into one stream.

`merged(generations)` runs each generation in its own task and yields `(index, step)` as steps arrive. If the
consumer stops early (client gone), every task is cancelled, and each generation's own cleanup aborts its engine
request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import AsyncIterator, Sequence

import anyio
from fastapi.responses import StreamingResponse

from serve.http.errors import APIError
from serve.http.generation import Generation, Step

log = logging.getLogger("glm5.serve")

DONE = "data: [DONE]\n\n"


def event_stream(events, ticket) -> StreamingResponse:
    """An SSE response over `events` (an async generator of `sse(...)` strings), framed by `_framed`: `[DONE]`
    at the end, an in-band error event if something fails after the stream started, and the request's slots
    given back however it ends. If the client vanishes before Starlette starts iterating, the generator never
    runs, so a finalizer on it is the safety net (Ticket.release is idempotent)."""
    framed = _framed(events, ticket)
    weakref.finalize(framed, ticket.release)
    return StreamingResponse(framed, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _framed(events, ticket):
    try:
        async for event in events:
            yield event
        yield DONE
    except Exception as e:  # the stream has started: report in-band, never drop the connection silently
        yield error_event(e)
        yield DONE
    finally:
        await events.aclose()  # a client that went away: the inner generator's cleanup runs now, not at GC
        ticket.release()


def chunk_writer(rid: str, created: int, model: str, object_: str, include_usage: bool):
    """`chunk(choices, usage=None) -> str`: one SSE chunk of a streamed chat or text completion."""

    def chunk(choices: list[dict], use=None) -> str:
        body = {"id": rid, "object": object_, "created": created, "model": model, "choices": choices}
        if include_usage:
            body["usage"] = use
        return sse(body)

    return chunk


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def error_event(exc: BaseException) -> str:
    """An error inside an already-started stream: sglang / vLLM send an error object as an event."""
    if isinstance(exc, APIError):
        return sse(exc.body())
    log.error("error inside a stream", exc_info=exc)
    return sse(APIError(500, f"internal error: {type(exc).__name__}: {exc}").body())


async def merged(generations: Sequence[Generation]) -> AsyncIterator[tuple[int, Step]]:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for step in gen.steps():
                await queue.put((i, step, None))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # reported to the consumer, which decides how to tell the client
            await queue.put((i, None, e))
            return
        await queue.put((i, None, None))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    remaining = len(tasks)
    try:
        while remaining:
            i, step, exc = await queue.get()
            if exc is not None:
                raise exc
            if step is None:
                remaining -= 1
                continue
            yield i, step
    finally:
        with anyio.CancelScope(shield=True):
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def drain(request, generations: Sequence[Generation], poll_s: float = 0.5) -> None:
    """Run `generations` to the end for a non-streamed response, giving up (and aborting them all) if the client
    disconnects first: a client that hangs up frees its KV blocks whether it streamed or not."""

    async def consume() -> None:
        async for _ in merged(generations):
            pass

    task = asyncio.create_task(consume())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                task.result()
                return
            if await request.is_disconnected():
                raise APIError(499, "the client closed the connection")
    finally:
        if not task.done():
            with anyio.CancelScope(shield=True):
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
