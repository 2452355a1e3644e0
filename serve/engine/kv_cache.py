"""The paged KV cache tensors: exactly what GLM-5 keeps per token and layer, nothing expanded.

Per main layer and token, MLA caches the compressed latent `c_kv` (kv_lora_rank values, after
kv_a_layernorm) and the shared rotary key `k_pe` (qk_rope_head_dim values, after RoPE); every head's
keys and values are re-derived from these through kv_b_proj (expanded in prefill, absorbed into the
query and output in decode). Each layer whose DSA indexer is "full" also caches its index key
(index_head_dim values, post-LayerNorm, post-RoPE). So bytes per token =
  element_size * (num_layers * (kv_lora_rank + qk_rope_head_dim) + num_full_indexer_layers * index_head_dim),
the figure `glm5 model info` prints (model.config.memory_bytes, per 1K tokens in bf16).

c_kv and k_pe sit side by side in one `latent` tensor per layer ([c_kv | k_pe], C + R values per slot), so
absorbed decode gathers a selected key with one read and scores it with one product.

Shapes: N = num_blocks, P = block_size (tokens per block), C = kv_lora_rank, R = qk_rope_head_dim,
Di = index_head_dim. A token's slot is `block_id * P + offset`; the flat views index by slot.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, cfg, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        L, self.C, self.R, Di = cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.index_head_dim
        full = [t == "full" for t in cfg.layer_indexer_types]
        kw = dict(dtype=dtype, device=device)
        self.latent_NPK = [torch.zeros(num_blocks, block_size, self.C + self.R, **kw) for _ in range(L)]
        # None on a "shared" indexer layer (GLM-5.x): it reuses the previous layer's top-k and stores no keys.
        self.index_k_NPD = [torch.zeros(num_blocks, block_size, Di, **kw) if f else None for f in full]

    @property
    def c_kv_NPC(self) -> list[torch.Tensor]:
        return [t[..., : self.C] for t in self.latent_NPK]

    @property
    def k_pe_NPR(self) -> list[torch.Tensor]:
        return [t[..., self.C :] for t in self.latent_NPK]

    @staticmethod
    def bytes_per_token(cfg, dtype: torch.dtype) -> int:
        n_full = sum(t == "full" for t in cfg.layer_indexer_types)
        values = cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + n_full * cfg.index_head_dim
        return values * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def num_blocks_for_memory(cls, cfg, block_size: int, dtype: torch.dtype, gib: float) -> int:
        return max(1, int(gib * 2**30) // (cls.bytes_per_token(cfg, dtype) * block_size))

    @property
    def num_bytes(self) -> int:
        tensors = self.latent_NPK + [t for t in self.index_k_NPD if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def latent_flat(self, layer: int) -> torch.Tensor:
        """Slot-indexed view [N*P, C + R] of one layer's latents."""
        return self.latent_NPK[layer].view(-1, self.C + self.R)

    def write(self, layer: int, slots_T, c_kv_TC, k_pe_TR, index_k_TD) -> None:
        latent = self.latent_flat(layer)  # each half straight into its columns: no concatenated copy first
        latent[:, : self.C].index_copy_(0, slots_T, c_kv_TC.to(self.dtype))
        latent[:, self.C :].index_copy_(0, slots_T, k_pe_TR.to(self.dtype))
        ik = self.index_k_NPD[layer]
        if ik is not None:
            ik.view(-1, ik.shape[-1]).index_copy_(0, slots_T, index_k_TD.to(self.dtype))
