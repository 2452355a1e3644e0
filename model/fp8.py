"""GLM-5-FP8's weight format: float8_e4m3fn weights with one fp32 `scale_inv` per 128 x 128 block (DeepSeek's
`weight_dequant`). Read by the checkpoint loader and by the INT4 converter (model/checkpoint.py,
model/compressed_tensors.py); knows nothing of files.
"""

from __future__ import annotations

import torch

FP8_BLOCK = 128


def dequantize_fp8(w: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """Blockwise FP8 -> fp32: each [block, block] tile of w times its scale ([ceil(out/b), ceil(in/b)])."""
    out_f, in_f = w.shape
    s = scale_inv.float().repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return w.float() * s


def quantize_fp8(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp -> (float8_e4m3fn weight, fp32 scale_inv per block): the inverse of `dequantize_fp8` up to rounding."""
    out_f, in_f = w.shape
    rows, cols = -(-out_f // block), -(-in_f // block)
    padded = torch.zeros(rows * block, cols * block, dtype=torch.float32)
    padded[:out_f, :in_f] = w.float()
    tiles = padded.view(rows, block, cols, block)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    q = (tiles / scale[:, None, :, None]).view(rows * block, cols * block)[:out_f, :in_f]
    return q.to(torch.float8_e4m3fn), scale
