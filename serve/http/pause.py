"""sglang's pause / continue around a weight push (sglang_for_rl.md: "pause_generation --- update weights ---
continue_generation is the correct execution flow"), with sglang's routes, bodies and answers:

- POST /pause_generation `{"mode": "abort" | "retract" | "in_place"}` -> `{"message", "status": "ok"}`. New
  generation requests (/generate, chat, completions) wait until /continue_generation, as sglang's tokenizer manager
  holds them. `abort` (sglang's default) ends every running request now, finish reason `abort`. `retract` and
  `in_place` leave them running: the embedded engine cannot hold a running request, so they keep decoding and an
  update that lands meanwhile is applied between two engine steps (the weights version of every token is reported,
  native.py), which is what sglang's retract ends up with after its recompute.
- POST /continue_generation `{"torch_empty_cache"?}` -> `{"message", "status": "ok"}`: the waiting requests go on.

Bodies are checked as sglang's msgspec structs check them: a wrong type or an unknown mode is a 400.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict

from serve.http.protocol import _Body, parse_body


class _Control(_Body):
    model_config = ConfigDict(strict=True, extra="forbid")
    rid: str | None = None  # sglang's BaseReq fields
    http_worker_ipc: str | None = None


class PauseRequest(_Control):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueRequest(_Control):
    torch_empty_cache: bool = True


class Pause:
    """The pause state one server shares: new generations wait on it; the running ones are listed for `abort`."""

    def __init__(self) -> None:
        self.paused = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.running: set[str] = set()

    async def wait(self) -> None:
        while self.paused:
            await self._resumed.wait()

    def pause(self) -> None:
        self.paused = True
        self._resumed.clear()

    def resume(self) -> None:
        self.paused = False
        self._resumed.set()


async def pause_generation(state, request: Request):
    req = parse_body(PauseRequest, await request.body() or b"{}")
    state.pause.pause()
    if req.mode == "abort":
        for rid in list(state.pause.running):
            await state.abort(rid)
    return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(state, request: Request):
    parse_body(ContinueRequest, await request.body() or b"{}")
    state.pause.resume()
    return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})
