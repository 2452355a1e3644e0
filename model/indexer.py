"""The DSA lightning indexer: picks, for each query, the `index_topk` keys that MLA attends to.

Exactly GLM-5's indexer (reference §3; DeepSeek-V3.2's with interleaved RoPE):
    q    = wq_b(qr)                     queries from MLA's normalised q-LoRA latent `qr`, I heads of Di dims
    k    = LayerNorm(wk(x))             one key per token (LayerNorm with bias, eps 1e-6, fp32 math)
    rope on the first R dims of q and k (layout [rope R | nope Di-R], unlike MLA's [nope | rope])
    w    = weights_proj(x) * I^-0.5     per-head weights, fp32
    I[t, s] = sum_h w[t, h] * ReLU(q[t, h] . k[s] * Di^-0.5)
    causal mask, then top-k over keys. Rows with fewer than k visible keys pick up masked slots too; attention
    masks causally again, so those never count (the reference's second mask).
The Hadamard rotation of the reference is skipped: it is orthogonal and applied to q and k alike, so q.k is
unchanged (it only matters for FP8 quantisation error), as in transformers.

When every key fits in the budget (S <= index_topk) the selection is all visible keys, so `select` returns None
and attention runs dense causal: exact, and it skips the O(T*S*I) score computation.

The indexer knows nothing of caches: an engine calls `keys` for new tokens, stores them (post-norm, post-rope,
[., Di] per token), and calls `select` with the queries against everything stored.

Shapes: B batch, T new tokens, S keys (cached + new), I index heads, Di index head dim, K = index_topk,
Q q_lora_rank, D hidden.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model import kernels
from model.config import GLM5Config

# Query rows per chunk so that the [chunk, I, S] score tensor stays below ~64M floats.
_SCORE_ELEMS = 1 << 26


def _power_of_two(x: float) -> bool:
    return math.frexp(x)[0] == 0.5


class Indexer(nn.Module):
    def __init__(self, cfg: GLM5Config) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        self.topk = cfg.index_topk
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)

    def _rope_front(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[rope(x[..., :R]) | x[..., R:]]: the indexer's layout puts the rope dims first."""
        return kernels.rope(x, cos, sin, rotary=self.rope_dim)

    def keys(self, x_BTD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Index keys of new tokens, ready to cache: [B, T, Di] (post LayerNorm, post rope)."""
        k = self.wk(x_BTD)
        k = F.layer_norm(k.float(), (self.head_dim,), self.k_norm.weight.float(), self.k_norm.bias.float(), 1e-6)
        return self._rope_front(k.to(x_BTD.dtype), cos, sin)

    def queries(self, qr_BTQ: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Index queries [B, T, I, Di] from MLA's q-LoRA latent."""
        B, T, _ = qr_BTQ.shape
        q = self.wq_b(qr_BTQ).view(B, T, self.n_heads, self.head_dim)
        return self._rope_front(q, cos[:, :, None], sin[:, :, None])

    def scores(self, q_BTID: torch.Tensor, x_BTD: torch.Tensor, k_BSD: torch.Tensor) -> torch.Tensor:
        """Index scores I[t, s] (fp32, unmasked) of new queries against keys: [B, T, S]."""
        B, T, n_heads, Di = q_BTID.shape
        w_BTI = self.weights_proj(x_BTD.to(self.weights_proj.weight.dtype)).float() * n_heads**-0.5
        scale = Di**-0.5
        # w * ReLU(l * 2^-m) == (w * 2^-m) * ReLU(l) bit for bit (scaling by a power of two is exact, barring
        # underflow to subnormals), so without autograd the scale goes onto the [T, I] weights instead of the
        # [T*I, S] logits.
        if _power_of_two(scale) and not torch.is_grad_enabled():
            return kernels.index_scores(q_BTID.float(), k_BSD.float(), w_BTI * scale)
        # One GEMM over all (query, head) rows: [B, T*I, Di] @ [B, Di, S]; then in place, no new buffers.
        logits = torch.bmm(q_BTID.reshape(B, T * n_heads, Di).float(), k_BSD.float().transpose(1, 2))
        return torch.matmul(w_BTI[:, :, None, :], logits.mul_(scale).relu_().view(B, T, n_heads, -1)).squeeze(2)

    def first_scored(self, q_idx_T: torch.Tensor) -> int:
        """Rows before this one see fewer than K keys and select them all without scores (see `select`)."""
        return int(((q_idx_T if q_idx_T.dim() == 1 else q_idx_T.amax(0)) < self.topk).sum())

    def select_from_latent(self, qr_BTQ, cos, sin, x_BTD, k_BSD, q_idx_T, segment_ids=None) -> torch.Tensor | None:
        """`select` with the queries made here from MLA's q-LoRA latent, only for the rows that get scores: in a
        prefill the first K rows select keys 0..K-1 whatever their queries (half the rows of a 2K prompt)."""
        if k_BSD.shape[1] <= self.topk:
            return None
        first = self.first_scored(q_idx_T)
        q = self.queries(qr_BTQ[:, first:], cos[:, first:], sin[:, first:])
        return self.select(q, x_BTD, k_BSD, q_idx_T, q_offset=first, segment_ids=segment_ids)

    def select(
        self,
        q_BTID: torch.Tensor,
        x_BTD: torch.Tensor,
        k_BSD: torch.Tensor,
        q_idx_T: torch.Tensor,
        q_offset: int = 0,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Top-k key indices [B, T, K] (int64, in no particular order) for each query, or None when all S keys fit.

        q_idx_T: each query's index in the sequence, [T] or [B, T] (key s is visible to query t iff s <= q_idx[t]).
        q_BTID holds the queries of rows q_offset..T-1 (rows before `first_scored` need none).
        segment_ids [B, T] (packed training rows, S == T): only keys of a query's own segment are candidates.
        """
        B, T, n_heads = x_BTD.shape[0], x_BTD.shape[1], q_BTID.shape[2]
        S = k_BSD.shape[1]
        if S <= self.topk:
            return None
        # Queries with fewer than K visible keys (q_idx < K) select all of them: keys 0..K-1, of which the
        # future ones are masked again by attention. Only the later rows need scores.
        first = self.first_scored(q_idx_T)
        if q_offset > first:
            raise ValueError(f"queries start at row {q_offset}, but row {first} needs scores")
        out = [torch.arange(self.topk, device=k_BSD.device).expand(B, first, self.topk)] if first else []
        # Scores over all S keys (not just the causal part): top-k is decided by tiny score differences, and
        # a GEMM over another key count rounds differently and flips near-ties (measured: 1e-2 logit changes).
        chunk = max(1, _SCORE_ELEMS // (n_heads * S))
        for t0 in range(first, T, chunk):
            sl = slice(t0, t0 + chunk)
            s = self.scores(q_BTID[:, t0 - q_offset : t0 - q_offset + chunk], x_BTD[:, sl], k_BSD)
            if int(q_idx_T[..., sl].min()) < S - 1:  # some key lies in some query's future (not in a decode)
                future = torch.arange(S, device=s.device) > q_idx_T[..., sl, None]  # [(B,) t, S]
                s = s.masked_fill_(future, float("-inf"))
            if segment_ids is not None:
                s = s.masked_fill_(segment_ids[:, sl, None] != segment_ids[:, None, :], float("-inf"))
            # The set of keys is what counts, not their order: unsorted, ~3x faster than sorting for K ~ S/2 (on
            # CPU a radix select that gives torch.topk's set, and leaves rows where that set is ambiguous to it).
            out.append(kernels.topk_indices(s, self.topk))
        return torch.cat(out, dim=1) if len(out) > 1 else out[0]
