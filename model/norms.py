"""RMSNorm, GLM-5's only normalisation in the trunk (the indexer's key LayerNorm is a plain nn.LayerNorm).

Computed in fp32 whatever the weight dtype, then cast back before the scale, as transformers and vLLM do.
"""

from __future__ import annotations

import torch
from torch import nn

from model import kernels


class RMSNorm(nn.Module):
    """`w * x / sqrt(mean(x^2) + eps)` over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or self.weight.dtype != x.dtype:
            x32 = x.float()
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x32.to(x.dtype)
        # Inference: the same operations, in place where the tensor is this function's own (products commute
        # exactly, so `y * w` is `w * y` bit for bit); on CPU as one fused kernel (the same bits again).
        return kernels.rms_norm(x, self.weight, self.eps)

    def add_forward(self, a: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference: the residual sum `a + h`, written into `a`, and this norm of it (fused on CPU)."""
        if self.weight.dtype != a.dtype:  # the norm's promoting path (forward)
            h = a.add_(h)
            return h, self(h)
        return kernels.add_rms_norm(a, h, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
