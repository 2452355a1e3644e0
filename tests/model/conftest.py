"""Shared helpers for the model tests: tiny configs and randomised weights."""

from __future__ import annotations

import pytest
import torch

from model.config import GLM5Config, preset

# Tiny tensors: one thread is faster than two fighting over a shared, loaded CI box (measured 10-30x here).
torch.set_num_threads(1)


def tiny(**changes) -> GLM5Config:
    return preset("tiny").replace(**changes)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every tensor random values (norm weights around 1, a non-zero routing bias) so that a swapped
    or ignored tensor shows up in the outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():  # persistent tensors only (not rope caches)
            if not t.is_floating_point():
                continue
            r = torch.randn(t.shape, generator=gen)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                t.copy_(1.0 + 0.2 * r)
            elif name.endswith("e_score_correction_bias"):
                t.copy_(0.1 * r)
            elif name.endswith("bias"):
                t.copy_(0.1 * r)
            elif "embed_tokens" in name:
                t.copy_(r)
            else:
                t.copy_(r * t.shape[-1] ** -0.5)
    return model


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
