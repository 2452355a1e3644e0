"""Shared helpers for the model tests: tiny configs and randomised weights."""

from __future__ import annotations

import pytest
import torch

from model.config import GLM5Config, preset

# Tiny tensors: one thread is faster than two fighting over a shared, loaded CI box (measured 10-30x here).
torch.set_num_threads(1)


def close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> bool:
    """Equal up to fp32 rounding, relative to the values' scale: max |got - want| <= rel * max |want|. The same
    sums in another order (another CPU's vector width, another BLAS build, a batch of another size) round
    differently by a few ulps of the largest values, never by a fraction of them as a bug does."""
    if got.shape != want.shape:
        return False
    scale = want.abs().max().item() if want.numel() else 0.0
    return (got - want).abs().max().item() <= rel * max(scale, 1e-30) if want.numel() else True


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
