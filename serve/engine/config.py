"""Runtime knobs of the embedded engine (not the model's architecture: that is model/config.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineConfig:
    """How big the batch and the KV cache are, and which attention path the runner takes.

    The cache holds `num_kv_blocks` blocks of `block_size` tokens; when `num_kv_blocks` is None it is sized
    from `kv_cache_gib`. `max_model_len` None means "whatever fits in the cache".
    `attn_impl`: "fast" (fused projections, batched sparse decode; see model_runner.py) or "plain" (the
    model's own modules, one sequence at a time: the reference the fast path is tested against).
    `sparse_prefill` (fast path, prefill chunks whose top-k drops keys): "gather" each query's selected
    latents, "mask" the expanded attention over the whole context, or "auto" by estimated cost.
    """

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_gib: float = 1.0
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    attn_impl: str = "fast"
    sparse_prefill: str = "auto"
    seed: int = 0
    # Speculative decoding: None, or "mtp" (the checkpoint's MTP layer drafts `num_draft_tokens` tokens per
    # step by chaining itself, the main model verifies them in the step's forward; serve/engine/spec_decode.py).
    speculative: str | None = None
    num_draft_tokens: int = 3
    # The tokens drafts are drawn from (FR-Spec's frequency-ranked subset): each draft then reads only these
    # rows of the lm_head, not all V. None: the whole vocabulary. Outputs never change (the main model verifies
    # against its full vocabulary); a token outside the set is simply never drafted. See spec_decode.py.
    draft_vocab: tuple[int, ...] | None = field(default=None, repr=False)  # thousands of ids: not in repr

    def __post_init__(self) -> None:
        if self.attn_impl not in ("plain", "fast"):
            raise ValueError(f"attn_impl must be 'plain' or 'fast', got {self.attn_impl!r}")
        if self.sparse_prefill not in ("auto", "gather", "mask"):
            raise ValueError(f"sparse_prefill must be 'auto', 'gather' or 'mask', got {self.sparse_prefill!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.speculative not in (None, "mtp"):
            raise ValueError(f"speculative must be None or 'mtp', got {self.speculative!r}")
        if self.speculative and not 1 <= self.num_draft_tokens <= 8:
            raise ValueError(f"num_draft_tokens must be in 1..8, got {self.num_draft_tokens}")
        if self.draft_vocab is not None:
            if self.speculative is None:
                raise ValueError("draft_vocab is only used with speculative='mtp'")
            if not self.draft_vocab:
                raise ValueError("draft_vocab is empty; pass None to draft from the whole vocabulary")
            if min(self.draft_vocab) < 0 or len(set(self.draft_vocab)) != len(self.draft_vocab):
                raise ValueError("draft_vocab must hold distinct non-negative token ids")
        if self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
