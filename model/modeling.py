"""GLM-5 (`GlmMoeDsaForCausalLM`): embedding -> decoder layers -> norm -> lm_head, plus the MTP layer(s).

Parameter names are the checkpoint's (`model.layers.3.mlp.experts.7.up_proj.weight`). `model.layers` holds the
`num_hidden_layers` main layers followed by the `num_nextn_predict_layers` MTP layers, exactly where the
checkpoint stores them; the main forward runs only the first `num_hidden_layers`.

The life of a forward: ids -> embed_tokens -> for each layer: MLA (the indexer picks top-k keys on 'full' layers,
'shared' layers reuse the previous layer's pick) and MLP/MoE -> model.norm -> lm_head -> logits [B, T, V].
`forward(..., return_hidden=True)` also returns the normed hidden, which is what `mtp_forward` takes.

Checkpoint I/O lives in model/checkpoint.py; `from_pretrained` / `save_pretrained` are thin doors to it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from model.checkpoint import load_pretrained, save_pretrained
from model.config import GLM5Config
from model.decoder_layer import DecoderLayer
from model.kv_cache import KVCache
from model.moe import MoE
from model.mtp import MTPLayer
from model.norms import RMSNorm
from model.rope import rope_cos_sin


class GLM5Model(nn.Module):
    """The trunk (`model.*` in the checkpoint)."""

    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        main = [
            DecoderLayer(cfg, mlp, has_indexer=(ix == "full"))
            for mlp, ix in zip(cfg.layer_mlp_types, cfg.layer_indexer_types, strict=True)
        ]
        self.layers = nn.ModuleList(main + [MTPLayer(cfg) for _ in range(cfg.num_nextn_predict_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.cfg.qk_rope_head_dim, self.cfg.rope_base)

    def forward(
        self,
        input_ids,
        positions,
        cache: KVCache | None = None,
        impl: str = "auto",
        keep_last: int = 0,
        segment_ids=None,
    ) -> torch.Tensor:
        """ids [B, T], positions [B, T] -> hidden after model.norm [B, T, D] ([B, keep_last, D] if keep_last > 0:
        the last layer then makes every token's cache entries but runs only the last `keep_last` tokens)."""
        start = cache.length if cache is not None else 0
        q_idx = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        cos, sin = self.rope(positions)
        h, topk = self.embed_tokens(input_ids), None
        n = self.cfg.num_hidden_layers
        for i in range(n):
            lc = cache.layers[i] if cache is not None else None
            h, topk = self.layers[i](h, cos, sin, q_idx, lc, topk, impl, keep_last if i == n - 1 else 0, segment_ids)
        return self.norm(h)


class GLM5ForCausalLM(nn.Module):
    """GLM-5 with its LM head. `model(input_ids)` -> logits [B, T, vocab_size]."""

    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__()
        self.config = cfg
        self.model = GLM5Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    # ---- forward ----------------------------------------------------------------------------------------
    def _check_ids(self, ids: torch.Tensor) -> None:
        if ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(ids.shape)}")
        if ids.numel() and (int(ids.max()) >= self.config.vocab_size or int(ids.min()) < 0):
            bad = ids[(ids >= self.config.vocab_size) | (ids < 0)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary (vocab_size {self.config.vocab_size})")

    @staticmethod
    def _positions(ids: torch.Tensor, positions: torch.Tensor | None, start: int) -> torch.Tensor:
        if positions is None:
            positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        return positions.expand(ids.shape[0], -1) if positions.dim() == 1 else positions

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        return_hidden: bool = False,
        attn_impl: str = "auto",
        logits_to_keep: int = 0,
        segment_ids: torch.Tensor | None = None,
    ):
        """input_ids [B, T] -> logits [B, T, V] (and the hidden after model.norm [B, T, D] if return_hidden).

        positions: [B, T] or [T] RoPE positions; default cache length + 0..T-1.
        cache: a `KVCache` to read and extend (incremental decoding); None for a stateless forward.
        attn_impl: 'auto' | 'expanded' | 'absorbed' (see MLA.forward).
        logits_to_keep: as in transformers, 0 for every position, n > 0 for the last n only (a prefill that only
        needs the next token: 1). Logits and hidden are then [B, n, ...]. Nothing reads the last layer's output
        at the other positions, so that layer runs only these n (its cache entries are still made for every
        token): a 512-token prefill with logits_to_keep=1 skips most of one layer and all but one lm_head row.
        segment_ids: [B, T] for rows that pack several sequences (training; no cache): tokens attend only within
        their own segment. Give each segment's positions from 0 as well, and each packed sequence is computed
        as if it were alone.
        """
        self._check_ids(input_ids)
        if segment_ids is not None and (cache is not None or segment_ids.shape != input_ids.shape):
            raise ValueError("segment_ids must be [batch, tokens] like input_ids, and cannot be used with a cache")
        if logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be >= 0 (0 keeps every position), got {logits_to_keep}")
        positions = self._positions(input_ids, positions, cache.length if cache is not None else 0)
        hidden = self.model(input_ids, positions, cache, attn_impl, keep_last=logits_to_keep, segment_ids=segment_ids)
        logits = self.lm_head(hidden)
        return (logits, hidden) if return_hidden else logits

    def mtp_forward(
        self,
        hidden: torch.Tensor,
        next_token_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        step: int = 0,
        attn_impl: str = "auto",
        segment_ids: torch.Tensor | None = None,
        logits: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One MTP draft step -> (draft_logits [B, T, V], mtp_hidden [B, T, D]).

        hidden [B, T, D]: for step 0 the main model's hidden after model.norm at positions t; for step k > 0
        the `mtp_hidden` that step k-1 returned. next_token_ids [B, T]: the token at t+1+k for each t (the
        one whose successor is drafted); positions: their RoPE positions (default 0..T-1 + cache offset).
        The layer used is `layers[num_hidden_layers + step % num_nextn_predict_layers]` (vLLM's rule; GLM-5
        has one layer, reused at every step). segment_ids [B, T]: packed training rows, as in `forward` (the
        ids' segments). logits=False returns (None, mtp_hidden): a trainer scores only its target rows.

        Fed back: `mtp_hidden` is the layer output *after* shared_head.norm, i.e. the lm_head input. That is
        the same kind of vector as step 0's input (the main hidden after model.norm, also an lm_head input),
        which is what GLM-5's shared-parameter recursive training feeds each step; sglang does the same
        (vLLM feeds the pre-norm value; the two differ, see reference §5).
        """
        n_mtp = self.config.num_nextn_predict_layers
        if n_mtp == 0:
            raise ValueError("this checkpoint has no MTP layer (num_nextn_predict_layers is 0)")
        self._check_ids(next_token_ids)
        j = step % n_mtp
        lc = cache.mtp[j] if cache is not None else None
        start = lc.length if lc is not None else 0
        positions = self._positions(next_token_ids, positions, start)
        q_idx = torch.arange(start, start + next_token_ids.shape[1], device=next_token_ids.device)
        cos, sin = self.model.rope(positions)
        layer: MTPLayer = self.model.layers[self.config.num_hidden_layers + j]
        emb = self.model.embed_tokens(next_token_ids)
        if segment_ids is not None and (cache is not None or segment_ids.shape != next_token_ids.shape):
            raise ValueError("segment_ids must be [batch, tokens] like next_token_ids, and cannot be used with a cache")
        mtp_hidden = layer.forward_mtp(emb, hidden, cos, sin, q_idx, lc, attn_impl, segment_ids)
        return (self.lm_head(mtp_hidden) if logits else None), mtp_hidden

    # ---- weights ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Random init as GLM-5 (normal(0, initializer_range) for linears and embeddings, ones for norms)."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * std)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            elif isinstance(m, (RMSNorm, nn.LayerNorm)):
                m.weight.fill_(1.0)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
        for name, p in self.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def tie_experts(self) -> None:
        """Re-stack every MoE layer's expert weights (after `.to(...)`); see MoE.tie_experts."""
        for m in self.modules():
            if isinstance(m, MoE):
                m.tie_experts()

    @classmethod
    def from_config(cls, cfg: GLM5Config, seed: int | None = None, dtype: torch.dtype = torch.float32):
        model = cls(cfg)
        model.init_weights(seed)
        if dtype != torch.float32:
            model = model.to(dtype)
            model.tie_experts()
        return model

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype | None = None, device: str = "cpu"):
        """Load a Hugging Face checkpoint directory (see model/checkpoint.py). dtype None: the config's."""
        return load_pretrained(cls, path, dtype=dtype, device=device)

    def save_pretrained(self, path: str | Path, max_shard_size: int | str = "5GB") -> None:
        save_pretrained(self, path, max_shard_size=max_shard_size)
