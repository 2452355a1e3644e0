"""A simple contiguous KV cache for the plain model: per layer, the MLA latent, the roped key, the index key.

This is what incremental decoding with `GLM5ForCausalLM.forward(..., cache=...)` needs and no more: tensors grow
by concatenation, all sequences in the batch have the same length, and key s of the cache is token s of the
sequence. The serving engine keeps its own paged cache and calls the MLA / indexer pieces directly.

Per token and layer it stores c_kv [C] (after kv_a_layernorm), k_pe [R] (roped) and, on layers with their own
indexer, the index key [Di] (post LayerNorm, post rope): 512 + 64 (+ 128) values for GLM-5.
"""

from __future__ import annotations

import torch


class LayerCache:
    """One layer's entries: c_kv [B, S, C], k_pe [B, S, R], index_k [B, S, Di] or None."""

    def __init__(self) -> None:
        self.c_kv: torch.Tensor | None = None
        self.k_pe: torch.Tensor | None = None
        self.index_k: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.c_kv is None else self.c_kv.shape[1]

    def append(self, c_kv: torch.Tensor, k_pe: torch.Tensor, index_k: torch.Tensor | None):
        """Add new tokens' entries; return the whole cache (c_kv, k_pe, index_k) including them."""

        def cat(old: torch.Tensor | None, new: torch.Tensor | None) -> torch.Tensor | None:
            return new if old is None or new is None else torch.cat([old, new], dim=1)

        self.c_kv, self.k_pe, self.index_k = cat(self.c_kv, c_kv), cat(self.k_pe, k_pe), cat(self.index_k, index_k)
        return self.c_kv, self.k_pe, self.index_k

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (e.g. drop rejected speculative tokens)."""
        if self.c_kv is not None:
            self.c_kv, self.k_pe = self.c_kv[:, :length], self.k_pe[:, :length]
            self.index_k = None if self.index_k is None else self.index_k[:, :length]


class KVCache:
    """Caches for every main layer (`layers`) and every MTP layer (`mtp`), which advance separately."""

    def __init__(self, num_layers: int, num_mtp_layers: int = 0) -> None:
        self.layers = [LayerCache() for _ in range(num_layers)]
        self.mtp = [LayerCache() for _ in range(num_mtp_layers)]

    @classmethod
    def for_config(cls, cfg) -> KVCache:
        return cls(cfg.num_hidden_layers, cfg.num_nextn_predict_layers)

    @property
    def length(self) -> int:
        """Tokens seen by the main model."""
        return self.layers[0].length if self.layers else 0

    def truncate(self, length: int, mtp_length: int | None = None) -> None:
        """Roll the main layers back to `length` tokens (and the MTP layers to `mtp_length`, if given)."""
        for lc in self.layers:
            lc.truncate(length)
        if mtp_length is not None:
            for lc in self.mtp:
                lc.truncate(mtp_length)
