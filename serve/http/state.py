"""ServerState: what every route shares (engine, tokenizer, settings, metrics) and the checks they share.

The admission bound lives here: each request takes one slot per choice before it reaches the engine and gives
them back when its response ends (however it ends), so a burst past `max_in_flight` gets 429 instead of an
unbounded queue.
"""

from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass, field

from model.chat import render
from serve.engine.sampling_params import SamplingParams
from serve.http.engine_protocol import AsyncEngine
from serve.http.errors import APIError, bad_request
from serve.http.metrics import ServerMetrics
from serve.http.pause import Pause
from serve.http.settings import ServerSettings

# Characters per token at most, for `check_text_length`: far above any real text's (about 4).
TEXT_CHARS_PER_TOKEN = 16


class Ticket:
    """Slots held by one request; `release()` may be called any number of times."""

    def __init__(self, state: ServerState, n: int):
        self.state, self.n, self.released = state, n, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.state.in_flight -= self.n


@dataclass
class ServerState:
    engine: AsyncEngine
    tokenizer: object
    settings: ServerSettings
    metrics: ServerMetrics = field(init=False)
    in_flight: int = 0
    ready: bool = False
    warmup_error: str | None = None
    grammars: object | None = None  # serve.engine.grammar.Grammars, made at the first constrained request
    weight_updater: object | None = None  # serve.http.weight_updates.WeightUpdater, made at the first update
    eos_ids: frozenset[int] = field(init=False)
    pause: Pause = field(default_factory=Pause)  # /pause_generation's state: new generations wait while it holds

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.settings.served_model_name)
        self.eos_ids = frozenset(getattr(self.tokenizer, "eos_token_ids", ()) or ())

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len)

    def render_chat(self, messages, tools, add_generation_prompt: bool, thinking: bool, clear: bool = True) -> str:
        """The prompt text: the checkpoint's own template when it has one, else GLM-5's (model/chat.py); what
        either refuses is a 400 naming it."""
        renderer = self.settings.chat_template.render if self.settings.chat_template is not None else render
        try:
            return renderer(messages, tools, add_generation_prompt, thinking, clear)
        except (ValueError, TypeError, KeyError) as e:  # TemplateRenderError is a ValueError
            raise bad_request(f"messages: {e}", param="messages") from None

    def check_model(self, name: str) -> None:
        if name != self.settings.served_model_name:
            raise APIError(  # 404 model_not_found, as OpenAI answers for a model it does not have
                404,
                f"model {name!r} is not served here; this server serves {self.settings.served_model_name!r}",
                param="model",
                code="model_not_found",
                kind="invalid_request_error",
            )

    def admit(self, n: int) -> Ticket:
        if self.in_flight + n > self.settings.max_in_flight:
            self.metrics.rejected += 1
            raise APIError(
                429,
                f"the server is at capacity ({self.in_flight} requests in flight, limit "
                f"{self.settings.max_in_flight}); retry later",
                code="server_busy",
            )
        self.in_flight += n
        return Ticket(self, n)

    def check_text_length(self, text: str, param: str) -> None:
        """A 400 for text too long to fit the context whatever its tokens, before it is tokenised: tokenising
        megabytes holds up the event loop, and no token is shorter than a character often enough to matter."""
        limit = self.max_model_len * TEXT_CHARS_PER_TOKEN
        if len(text) > limit:
            raise bad_request(
                f"the prompt is {len(text)} characters, but this model's context length is {self.max_model_len} "
                f"tokens; text past {limit} characters is refused before it is tokenised",
                param=param,
                code="context_length_exceeded",
            )

    def max_new_tokens(self, prompt_len: int, requested: int | None, prompt_param: str, limit_param: str) -> int:
        """The tokens a request may generate, or a 400 when the prompt or the request exceeds the context."""
        context = self.max_model_len
        if prompt_len >= context:
            raise bad_request(
                f"the prompt is {prompt_len} tokens, but this model's context length is {context} tokens "
                f"(at least one token must be left to generate)",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if requested is not None and prompt_len + requested > context:
            raise bad_request(
                f"{limit_param} is {requested}, and with the prompt's {prompt_len} tokens that is "
                f"{prompt_len + requested} tokens, past this model's context length of {context} tokens",
                param=limit_param,
                code="context_length_exceeded",
            )
        return requested if requested is not None else context - prompt_len

    def sampling_params(
        self, req, max_tokens: int, seed: int | None, logprobs: int | None, constraint=None
    ) -> SamplingParams:
        """The engine's SamplingParams from a request's sampling fields; the engine's own checks become 400s.
        The engine keeps no text (`detokenize=False`): the app decodes each token once, itself (generation.py)."""
        stop_ids = tuple(req.stop_token_ids or ())
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in stop_ids):
            raise bad_request(f"stop_token_ids must be token ids in [0, {vocab})", param="stop_token_ids")
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(0, req.top_k or 0),
                min_p=req.min_p or 0.0,
                repetition_penalty=req.repetition_penalty or 1.0,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                seed=seed,
                stop_token_ids=stop_ids,
                ignore_eos=req.ignore_eos,
                logprobs=logprobs,
                constraint=constraint,
                detokenize=False,
            )
        except ValueError as e:
            raise bad_request(str(e)) from None

    async def abort(self, request_id: str) -> None:
        result = self.engine.abort(request_id)
        if inspect.isawaitable(result):
            await result

    def engine_metrics(self) -> dict:
        try:
            return dict(self.engine.metrics() or {})
        except Exception:  # a scrape must not fail because a gauge could not be read
            return {}


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice i of n gets seed + i, so n choices differ and the same request reproduces them."""
    return None if seed is None else seed + index


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"
