"""One request's tokens and bookkeeping as it moves through the engine.

A Sequence knows its token ids (prompt + generated), how many of them already have KV entries in the
cache (`num_computed_tokens`), its block table, and what it has sampled so far. It knows nothing about
tensors except its own seeded random generator, which lives here so that preemption (which throws away
the cache and recomputes) does not restart the random stream.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from serve.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    """The sampled token's logprob and, when asked for, the top-n alternatives (token id -> logprob)."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


class Sequence:
    """A request inside the engine. `token_ids` grows by one per decode step."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival: int = 0):
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        self.request_id = request_id
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.arrival = arrival
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        # Tokens whose KV entries are in the cache (from the prefix cache or computed by the runner).
        self.num_computed_tokens = 0
        # Of those, how many were found in the prefix cache at the last admission (for metrics).
        self.num_cached_tokens = 0
        # Prefix-cache bookkeeping of the block manager: blocks already registered, and the chain hash so far.
        self.num_committed_blocks = 0
        self.last_block_hash: int | None = None
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        # Speculative decoding (serve/engine/spec_decode.py SpecState): drafts to verify next step; None when off.
        self.spec = None
        self.generator = torch.Generator()
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={len(self)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def num_blocks_for(self, num_tokens: int, block_size: int) -> int:
        return (num_tokens + block_size - 1) // block_size

    def block_tokens(self, i: int, block_size: int) -> list[int]:
        return self.token_ids[i * block_size : (i + 1) * block_size]

    def append_token(self, token_id: int, logprob: TokenLogprob) -> None:
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
