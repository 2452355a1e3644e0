"""The multi-token-prediction (MTP) layer: a full decoder layer that drafts the token after next.

Stored as `model.layers.{num_hidden_layers + i}`: every tensor of a MoE decoder layer (MLA, its own indexer,
experts) plus `enorm`, `hnorm`, `eh_proj` and `shared_head.norm`. The embedding and lm_head are the main
model's (the checkpoint has no copies). For a main-model hidden h_t and the next token x_{t+1} (reference §5):
    z = eh_proj(cat([enorm(embed(x_{t+1})), hnorm(h_t)]))      order: [embedding, hidden]
    z = DecoderLayer(z, position of x_{t+1})
    draft logits = lm_head(shared_head.norm(z))               a guess at x_{t+2}
GLM-5 trains one set of MTP weights shared over 3 recursive steps, and serves it chained 3 times.
"""

from __future__ import annotations

import torch
from torch import nn

from model.config import GLM5Config
from model.decoder_layer import DecoderLayer
from model.norms import RMSNorm


class SharedHead(nn.Module):
    """`shared_head.norm`; the head itself is the main lm_head (`shared_head.head` is absent on disk)."""

    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MTPLayer(DecoderLayer):
    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__(cfg, mlp_type="sparse" if cfg.n_routed_experts else "dense", has_indexer=True)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.shared_head = SharedHead(cfg)

    def forward_mtp(
        self, emb_BTD, hidden_BTD, cos, sin, q_idx, layer_cache=None, impl="auto", segment_ids=None
    ) -> torch.Tensor:
        """-> the layer's output after shared_head.norm [B, T, D] (the lm_head input)."""
        z = self.eh_proj(torch.cat([self.enorm(emb_BTD), self.hnorm(hidden_BTD)], dim=-1))
        z, _ = super().forward(z, cos, sin, q_idx, layer_cache, None, impl, segment_ids=segment_ids)
        return self.shared_head.norm(z)
