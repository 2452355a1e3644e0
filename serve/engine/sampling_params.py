"""Per-request sampling parameters, named as in vLLM and the OpenAI API.

`n` (several choices per prompt) is the server's business: it submits n requests with derived seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serve.engine.grammar import Grammar


# Temperatures below this sample greedily.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 (or below 1e-5) means greedy. top_k <= 0 and top_p == 1 and min_p == 0 disable those filters.
    `logprobs` is the number of top alternatives returned with each sampled token (None: only the
    sampled token's own logprob is recorded, which the engine always does). A token that stops the
    request (EOS, stop_token_ids) stays in `token_ids` but adds nothing to the text, as in vLLM.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    # As vLLM. The GLM-5 chat server wants False: <think>, <tool_call> and friends are special tokens in
    # glm5's shipped tokenizer, and the reasoning / tool-call parsers read them from the text.
    skip_special_tokens: bool = True
    # A grammar the output must follow (serve/engine/grammar.py: JSON, a JSON schema, GLM-5 tool calls): the
    # sampler masks what it does not allow. Compiled once and shared; each request walks it on its own. Left
    # out of equality and hashing (a compiled grammar is neither).
    constraint: Grammar | None = field(default=None, compare=False)
    # False: the engine keeps no text for this request (`RequestOutput.text` stays ""), for a caller that
    # decodes the tokens itself, as the HTTP app does (vLLM's `detokenize`). Stop strings need the text.
    detokenize: bool = True

    def __post_init__(self) -> None:
        # Accept lists / a single string for convenience, store tuples so params stay hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in (self.stop_token_ids or ())))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0 or None, got {self.logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (the engine finds them in the text)")

    @property
    def greedy(self) -> bool:
        # A tiny temperature is greedy in all but name, and dividing by it overflows the logits (1e-300 is 0 in
        # float32: NaN everywhere); vLLM draws the same line (_SAMPLING_EPS).
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
