"""One pre-norm GLM-5 decoder layer: h += MLA(input_layernorm(h)); h += MLP-or-MoE(post_attention_layernorm(h))."""

from __future__ import annotations

import torch
from torch import nn

from model.attention import MLA
from model.config import GLM5Config
from model.moe import MLP, MoE
from model.norms import RMSNorm


class DecoderLayer(nn.Module):
    def __init__(self, cfg: GLM5Config, mlp_type: str, has_indexer: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLA(cfg, has_indexer=has_indexer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if mlp_type == "sparse" else MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self, h, cos, sin, q_idx, layer_cache=None, prev_topk=None, impl="auto", keep_last: int = 0, segment_ids=None
    ):
        """h [B, T, D] -> (h [B, T, D], this layer's top-k indices or None). See MLA.forward for the rest.
        keep_last > 0: every token's cache entries, but the output only for the last `keep_last` tokens."""
        x = self.input_layernorm(h)
        a, topk = self.self_attn(x, cos, sin, q_idx, layer_cache, prev_topk, impl, keep_last, segment_ids)
        h = h[:, -a.shape[1] :] if a.shape[1] != h.shape[1] else h
        if torch.is_grad_enabled() or a.dtype != h.dtype:
            h = h + a
            return h + self.mlp(self.post_attention_layernorm(h)), topk
        # Inference: the residual sums go into the sublayers' own fresh outputs (the same values: addition
        # commutes exactly), saving two [B, T, D] allocations per layer. Never into `h`: the caller's tensor.
        h, normed = self.post_attention_layernorm.add_forward(a, h)
        return self.mlp(normed).add_(h), topk
