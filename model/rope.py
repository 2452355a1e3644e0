"""Rotary position embedding, interleaved-pair (GPT-J) style, as GLM-5 uses in MLA and in the DSA indexer.

GLM-5 rotates adjacent pairs (x0, x1), (x2, x3), ... each by one frequency (config `rope_interleave` and
`indexer_rope_interleave` are both true). `apply_rope` returns the rotated pairs de-interleaved: all first
members, then all second members. That is a fixed permutation of the rope dims, applied to queries and keys
alike, so every q.k dot product is the one interleaved RoPE gives; it is also bit-identical to transformers'
`apply_rotary_pos_emb_interleave`. Caches store roped keys in this order.

Shapes: positions [B, T] (or [T]); cos/sin [B, T, R/2] in fp32; x [..., R] with R = the rope dim.
"""

from __future__ import annotations

import torch

from model import kernels


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of `position * theta^(-2i/dim)` for i < dim/2, fp32, shape positions.shape + [dim/2].

    Computed per call from the positions (no buffer), so the module tree holds no state that a meta-device
    build would have to re-create.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    freqs = positions[..., None].float() * inv_freq
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x's last dim; cos/sin must broadcast to x[..., ::2]. Output de-interleaved:
    [x1 * cos - x2 * sin | x2 * cos + x1 * sin] for x1, x2 = x[..., 0::2], x[..., 1::2] (model/kernels)."""
    return kernels.rope(x, cos, sin)
