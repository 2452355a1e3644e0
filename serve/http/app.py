"""`create_app(engine, tokenizer, settings)`: the FastAPI app, with every route a thin call into its module.

Startup runs one warm-up generation in the background (sglang does the same); until it succeeds /health answers
503, so a load balancer or `glm5 serve --engine` wrapper only sends traffic to a server that has produced a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from serve.engine.sampling_params import SamplingParams
from serve.http import chat, completions, native, pause, tokenize, weight_updates
from serve.http.auth import BearerAuth
from serve.http.engine_protocol import AsyncEngine, EngineBusy
from serve.http.errors import APIError, install_error_handlers
from serve.http.generation import Generation
from serve.http.middleware import AccessLog, BodyLimit, BodyTooLarge, InternalErrors, LoopbackOnly, too_large
from serve.http.settings import ServerSettings
from serve.http.state import ServerState

log = logging.getLogger("glm5.serve")


async def one_token(state: ServerState, timeout: float) -> None:
    """Generate one token from a one-token prompt; raises if the engine cannot."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    prompt = state.tokenizer.encode("hello")[:1] or [0]
    gen = Generation(state, prompt, params)
    result = await asyncio.wait_for(gen.run(), timeout)
    if len(result.token_ids) != 1:
        raise RuntimeError(f"warm-up produced {len(result.token_ids)} tokens ({result.finish_reason})")


async def warm_up(state: ServerState, on_ready: Callable[[], None] | None) -> None:
    try:
        await one_token(state, state.settings.warmup_timeout_s)
        state.ready = True
        log.info("warm-up generation succeeded; the server is ready")
        if on_ready is not None:
            on_ready()
    except Exception as e:  # /health keeps answering 503 and says why
        state.warmup_error = f"{type(e).__name__}: {e}"
        log.exception("warm-up generation failed")


# The POST routes that are one call into their module: `handler(state, request)`.
_POST_ROUTES: tuple[tuple[str, Callable], ...] = (
    ("/v1/chat/completions", chat.chat_completions),
    ("/v1/completions", completions.completions),
    ("/generate", native.generate),
    ("/update_weights_from_disk", weight_updates.update_weights_from_disk),
    ("/load_lora_adapter", weight_updates.load_lora_adapter),
    ("/unload_lora_adapter", weight_updates.unload_lora_adapter),
    ("/update_weight_version", weight_updates.update_weight_version),
    ("/pause_generation", pause.pause_generation),
    ("/continue_generation", pause.continue_generation),
    ("/v1/tokenize", tokenize.tokenize),
    ("/v1/detokenize", tokenize.detokenize),
)


def create_app(
    engine: AsyncEngine, tokenizer, settings: ServerSettings, on_ready: Callable[[], None] | None = None
) -> FastAPI:
    """The app over `engine`; `tokenizer` needs encode / decode / eos_token_ids (model.tokenizer.Tokenizer)."""
    state = ServerState(engine, tokenizer, settings)
    app = FastAPI(title="glm5 serve", lifespan=_lifespan(state, on_ready), docs_url=None, redoc_url=None)
    app.state.glm5 = state
    install_error_handlers(app)
    _add_exception_handlers(app, state)
    for path, handler in _POST_ROUTES:
        app.add_api_route(path, _endpoint(state, handler), methods=["POST"], name=handler.__name__)

    @app.get("/get_weight_version")
    async def _weight_version():
        return await weight_updates.get_weight_version(state)

    _add_model_routes(app, state)
    _add_health_routes(app, state)

    @app.get("/metrics")
    async def _metrics():
        text = state.metrics.render(state.engine_metrics(), state.in_flight)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    _add_middleware(app, settings)
    return app


def _lifespan(state: ServerState, on_ready: Callable[[], None] | None):
    """Startup runs the warm-up generation in the background (or marks the server ready without one)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        task = None
        if state.settings.warmup:
            task = asyncio.create_task(warm_up(state, on_ready))
        else:
            state.ready = True
        yield
        if task is not None and not task.done():
            task.cancel()

    return lifespan


def _add_exception_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(EngineBusy)
    async def _busy(_request: Request, exc: EngineBusy):
        state.metrics.rejected += 1
        return APIError(429, f"the engine's queue is full ({exc}); retry later", code="server_busy").response()

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_request: Request, exc: BodyTooLarge):
        return too_large(exc.limit).response()


def _endpoint(state: ServerState, handler: Callable):
    """The route's endpoint: `handler(state, request)`."""

    async def endpoint(request: Request):
        return await handler(state, request)

    return endpoint


def _add_model_routes(app: FastAPI, state: ServerState) -> None:
    settings = state.settings

    def model_card() -> dict:
        name = settings.served_model_name
        return {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "glm5",
            "root": name,
            "max_model_len": state.max_model_len,
        }

    @app.get("/v1/models")
    async def _models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def _model(model: str):
        if model != settings.served_model_name:
            raise APIError(404, f"model {model!r} is not served here", param="model", code="model_not_found")
        return model_card()


def _add_health_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def _health():
        if not state.ready:
            detail = state.warmup_error or "warming up"
            return JSONResponse({"status": "starting", "detail": detail}, status_code=503)
        if not getattr(state.engine, "healthy", True):
            return JSONResponse({"status": "unhealthy", "detail": "the engine has stopped"}, status_code=503)
        return {"status": "ok"}

    probe: asyncio.Task | None = None

    @app.get("/health_generate")
    async def _health_generate():
        # Open without a key and outside admission (load balancers probe it), so concurrent probes share one
        # in-flight generation: a flood of them costs the engine one request, not one each.
        nonlocal probe
        if not state.ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        if probe is None or probe.done():
            probe = asyncio.create_task(one_token(state, state.settings.health_generate_timeout_s))
            probe.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if nobody waits
        try:
            await asyncio.shield(probe)  # a prober that hangs up does not cancel the others' probe
        except Exception as e:
            return JSONResponse({"status": "unhealthy", "detail": f"{type(e).__name__}: {e}"}, status_code=503)
        return {"status": "ok"}


def _add_middleware(app: FastAPI, settings: ServerSettings) -> None:
    # Added last = outermost: the access log sees every answer, a 401 or a 413 included.
    app.add_middleware(InternalErrors)  # innermost: a bug is a 500 and the connection stays usable
    if settings.api_key:
        app.add_middleware(BearerAuth, api_key=settings.api_key)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.loopback_only:
        app.add_middleware(LoopbackOnly)
    if settings.access_log:
        app.add_middleware(AccessLog)
