"""Usage totals of a session (tokens, cost, model calls) and the limits checked against them before each call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agent.flow import LimitsExceeded
from agent.settings import Limits


@dataclass
class Stats:
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    last_prompt_tokens: int = 0  # the context's size after the last call: what auto-compaction watches

    def add_call(self, usage: dict[str, Any], input_cost_per_mtok: float, output_cost_per_mtok: float) -> float:
        """Count one model call; returns its cost in USD."""
        p, c = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        self.steps += 1
        self.prompt_tokens += p
        self.completion_tokens += c
        self.last_prompt_tokens = p + c
        cost = (p * input_cost_per_mtok + c * output_cost_per_mtok) / 1e6
        self.cost_usd += cost
        return cost

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "last_prompt_tokens": self.last_prompt_tokens,
        }


def check_limits(stats: Stats, limits: Limits, turn_steps: int, turn_start: float) -> None:
    """Raise LimitsExceeded when the turn's steps or the session's tokens, cost or the turn's time ran out."""
    if turn_steps >= limits.max_steps:
        raise LimitsExceeded(f"step limit reached ({limits.max_steps} model calls)")
    if limits.max_tokens is not None and stats.prompt_tokens + stats.completion_tokens >= limits.max_tokens:
        raise LimitsExceeded(f"token limit reached ({limits.max_tokens})")
    if limits.max_cost_usd is not None and stats.cost_usd >= limits.max_cost_usd:
        raise LimitsExceeded(f"cost limit reached (${limits.max_cost_usd:.2f})")
    if limits.max_wall_s is not None and time.monotonic() - turn_start >= limits.max_wall_s:
        raise LimitsExceeded(f"wall-time limit reached ({limits.max_wall_s:g}s)")
