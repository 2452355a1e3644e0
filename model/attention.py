"""Multi-head latent attention (MLA) with DSA top-k selection, in pieces an engine can reuse over its own cache.

Per token, MLA caches only a latent c_kv (kv_lora_rank, after kv_a_layernorm) and one roped key k_pe shared by
all heads (qk_rope_head_dim): 512 + 64 values for GLM-5. Per-head keys and values are kv_b_proj(c_kv).

    project_q   x -> q_nope, q_pe (roped), and the q-LoRA latent qr (the indexer's input)
    project_kv  x -> c_kv, k_pe: the cache entries for new tokens
    attend_expanded  prefill / training: expand k_nope, v = kv_b_proj(c_kv) per head, dense scores, top-k as mask
    attend_absorbed  decode: fold W_UK into the query and W_UV after the output, so scores and the weighted sum
                     run over the latent (C + R values per key) and never expand keys; with top-k indices it
                     gathers only the selected keys (the real sparse path)
The two attend paths are the same function of their inputs (tests check it), with and without top-k.

Absorption: kv_b_proj.weight viewed as [H, Dn + Dv, C] splits into W_UK [H, Dn, C] and W_UV [H, Dv, C];
q_nope . (W_UK c) = (q_nope W_UK) . c, and sum_s p_s (W_UV c_s) = W_UV (sum_s p_s c_s). The absorbed path reads
`kv_b_proj.weight` directly: a module swapped in for kv_b_proj (INT4, LoRA) must give a dense `.weight`
(or define `dense_weight()`), or the caller must use the expanded path, which only calls the module.

Causality is by order in the sequence: key s is visible to query t iff s <= q_idx[t] (q_idx = the queries'
indices, cache length + 0..T-1). q_idx is [T] for a batch of equal lengths, or [B, T] per sequence: in a
ragged decode batch, keys past a sequence's own index (padding) are then invisible to it. Positions only drive
RoPE. attention_dropout is not applied (it is 0 for GLM-5).

Shapes: B batch, T new tokens, S keys, H heads, Dn qk_nope_head_dim, Dv v_head_dim, R qk_rope_head_dim,
C kv_lora_rank, Q q_lora_rank, D hidden, K top-k.
"""

from __future__ import annotations

import torch
from torch import nn

from model import kernels
from model.config import GLM5Config
from model.indexer import Indexer
from model.norms import RMSNorm
from model.rope import apply_rope

_GATHER_ELEMS = 1 << 25  # query rows per chunk in the gathered sparse path: chunk * K * (C + R) floats
_QUERY_BLOCK = 128  # query rows per block in the expanded path


class MLA(nn.Module):
    def __init__(self, cfg: GLM5Config, has_indexer: bool = True) -> None:
        super().__init__()
        self.n_heads, self.dn, self.dr, self.dv = (
            cfg.num_attention_heads,
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
        )
        self.kv_lora_rank, self.scale = cfg.kv_lora_rank, cfg.softmax_scale
        H, bias = self.n_heads, cfg.attention_bias
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=bias)
        # eps: rms_norm_eps, as vLLM/sglang (reference §4). transformers uses 1e-6 here; the parity tests set
        # rms_norm_eps=1e-6 so both agree.
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + self.dr, bias=bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, H * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(H * self.dv, cfg.hidden_size, bias=bias)
        # 'shared' indexer layers have no indexer of their own (and no indexer tensors in the checkpoint).
        self.indexer = Indexer(cfg) if has_indexer else None

    # ---- pieces -----------------------------------------------------------------------------------------
    def project_q(self, x_BTD, cos, sin):
        """-> q_nope [B, T, H, Dn], q_pe [B, T, H, R] (roped), qr [B, T, Q] (normalised q-LoRA latent)."""
        B, T, _ = x_BTD.shape
        qr = self.q_a_layernorm(self.q_a_proj(x_BTD))
        q = self.q_b_proj(qr).view(B, T, self.n_heads, self.dn + self.dr)
        q_nope, q_pe = q.split([self.dn, self.dr], dim=-1)
        return q_nope, apply_rope(q_pe, cos[:, :, None], sin[:, :, None]), qr

    def project_kv(self, x_BTD, cos, sin):
        """Cache entries of new tokens -> c_kv [B, T, C] (after kv_a_layernorm), k_pe [B, T, R] (roped)."""
        c_kv, k_pe = self.kv_a_proj_with_mqa(x_BTD).split([self.kv_lora_rank, self.dr], dim=-1)
        return self.kv_a_layernorm(c_kv), apply_rope(k_pe, cos, sin)

    def _kv_b_weight(self) -> torch.Tensor:
        dense = getattr(self.kv_b_proj, "dense_weight", None)
        w = dense() if callable(dense) else self.kv_b_proj.weight
        return w.view(self.n_heads, self.dn + self.dv, self.kv_lora_rank)

    def attend_expanded(
        self, q_nope, q_pe, c_kv, k_pe, q_idx, topk_idx=None, out=None, segment_ids=None
    ) -> torch.Tensor:
        """Dense attention over expanded per-head keys; top-k (if any) applied as a mask. -> [B, T, H, Dv], written
        into `out` when given (a [B, T, H, Dv] view whose rows are contiguous [H, Dv], e.g. rows of a bigger batch).

        q_nope [B,T,H,Dn], q_pe [B,T,H,R], c_kv [B,S,C], k_pe [B,S,R], q_idx [T] or [B,T], topk_idx [B,T,K] or None;
        a row that sees fewer than K keys must select all it sees (indexer.select's rule, relied on to skip the
        top-k mask where it would drop nothing). segment_ids [B, T] (packed training rows, T == S): a key is visible
        only to queries of its own segment.
        Written out (scores, mask, softmax, weighted sum) rather than through SDPA: with Dn+R != Dv and a mask,
        CPU SDPA takes its math fallback, which adds a bool->float mask, a NaN-safe softmax and a scaled copy of
        q and k per call (measured: ~2x the time of this loop on the `small` preset).
        """
        B, S, _ = c_kv.shape
        H, T = self.n_heads, q_nope.shape[1]
        k_nope, v = self.kv_b_proj(c_kv).view(B, S, H, self.dn + self.dv).split([self.dn, self.dv], dim=-1)
        # q pre-scaled [B, T, H, Dn+R] and k [B, S, H, Dn+R] (k_pe shared by the heads); v [B, S, H, Dv].
        q = kernels.concat_heads(q_nope, q_pe, self.scale)
        k = kernels.concat_heads(k_nope, k_pe[:, :, None])
        K = topk_idx.shape[-1] if topk_idx is not None else S
        if out is None:
            out = q.new_empty(B, T, H, self.dv)  # each block's output lands here: no concatenation, no copy back
        # Query blocks only look at keys up to their last index (causality): ~40% fewer scores in a prefill.
        for t0 in range(0, T, _QUERY_BLOCK):
            t1 = min(t0 + _QUERY_BLOCK, T)
            last = int(q_idx[..., t1 - 1].max())
            s_end = min(S, last + 1)
            # If every row of the block sees at most K keys, top-k drops nothing (a row that sees fewer than K
            # selects all of them: indexer.select's rule) and causality is the whole mask. Every row keeps at
            # least key 0 or its top-k picks, so no row is all -inf.
            picks = topk_idx[:, t0:t1] if last >= K else None
            bias = kernels.attn_bias(picks, q_idx[..., t0:t1], s_end, n_keys=S, dtype=q.dtype)  # [(B,) t, s]
            if segment_ids is not None:  # packed sequences: no attention across their boundaries
                other = segment_ids[:, t0:t1, None] != segment_ids[:, None, :s_end]
                bias = bias.masked_fill(other, float("-inf"))
            kernels.attend(q[:, t0:t1], k[:, :s_end], v[:, :s_end], bias, out[:, t0:t1])
        return out

    def attend_absorbed(self, q_nope, q_pe, c_kv, k_pe, q_idx, topk_idx=None) -> torch.Tensor:
        """Attention over the latent cache with W_UK / W_UV absorbed. Same arguments and result as expanded.

        With topk_idx, each query gathers only its K selected latents ([B, T, K, C + R]): the real sparse path.
        """
        w = self._kv_b_weight()
        w_uk, w_uv = w[:, : self.dn], w[:, self.dn :]  # [H, Dn, C], [H, Dv, C]
        B, T, H, _ = q_nope.shape
        C = self.kv_lora_rank
        # The contractions are written as the batched GEMMs einsum would run ("bthd,hdc->bthc" is a GEMM per head
        # over the B*T rows, ...), without its planning: the same bits, ~40% less time for a decode step's
        # small tensors (a test checks both against einsum).
        q_abs = torch.bmm(q_nope.reshape(B * T, H, -1).transpose(0, 1), w_uk).transpose(0, 1).reshape(B, T, H, C)
        if topk_idx is None:
            S = c_kv.shape[1]
            scores = torch.bmm(q_abs.reshape(B, T * H, C), c_kv.transpose(1, 2))  # [B, T*H, S]
            scores = scores + torch.bmm(q_pe.reshape(B, T * H, -1), k_pe.transpose(1, 2))
            visible = torch.arange(S, device=c_kv.device) <= q_idx[..., None]  # [(B,) T, S]
            scores = (
                scores.view(B, T, H, S).float().mul_(self.scale).masked_fill_(~visible[..., None, :], float("-inf"))
            )
            probs = scores.softmax(-1).to(c_kv.dtype)
            o_lat = torch.bmm(probs.view(B, T * H, S), c_kv).view(B, T, H, C)  # [B, T, H, C]
        else:
            B, T, K = topk_idx.shape
            S = c_kv.shape[1]
            kv = torch.cat([c_kv, k_pe], dim=-1).reshape(B * S, -1)  # [B*S, C+R]: one row per key
            q_cat = torch.cat([q_abs, q_pe], dim=-1)  # [B, T, H, C+R]
            offset = (torch.arange(B, device=c_kv.device) * S)[:, None, None]
            chunk = max(1, _GATHER_ELEMS // (B * K * kv.shape[-1]))
            parts = []
            for t0 in range(0, T, chunk):
                idx = topk_idx[:, t0 : t0 + chunk]  # [B, t, K]
                sel = kv.index_select(0, (idx + offset).flatten()).view(*idx.shape, -1)  # [B, t, K, C+R]: row copies
                s = torch.matmul(q_cat[:, t0 : t0 + chunk], sel.transpose(-1, -2))  # [B, t, H, K]
                visible = idx <= q_idx[..., t0 : t0 + chunk, None]  # re-mask: rows with < K visible keys
                s = s.float().mul_(self.scale).masked_fill_(~visible[:, :, None], float("-inf"))
                parts.append(torch.matmul(s.softmax(-1).to(c_kv.dtype), sel[..., : self.kv_lora_rank]))
            o_lat = torch.cat(parts, dim=1)
        out = torch.bmm(o_lat.reshape(B * T, H, C).transpose(0, 1), w_uv.transpose(1, 2))  # [H, B*T, Dv]
        return out.transpose(0, 1).reshape(B, T, H, -1)

    def attend_absorbed_latents(self, q_nope_BHD, q_pe_BHR, lat_BKL, valid_BK=None) -> torch.Tensor:
        """Absorbed attention for B single queries, each over its own K gathered latents [c_kv | k_pe]
        ([B, K, C + R], e.g. a serving engine's selected cache rows). -> [B, H, Dv].

        Invalid keys (padding, future positions) are masked out of the softmax. Scores use
        [q_nope W_UK | q_pe] against the stored [c_kv | k_pe] in one product; the weighted sum of latents is
        mapped to values by W_UV afterwards: `attend_absorbed`'s maths for one query row each."""
        w = self._kv_b_weight()  # [H, Dn + Dv, C]
        w_uk, w_uv = w[:, : self.dn], w[:, self.dn :]
        q_abs_BHC = torch.bmm(q_nope_BHD.transpose(0, 1), w_uk).transpose(0, 1)  # [B, H, C]
        q_BHL = torch.cat([q_abs_BHC, q_pe_BHR], -1)
        s_BHK = torch.bmm(q_BHL, lat_BKL.transpose(1, 2)).float().mul_(self.scale)
        if valid_BK is not None:
            s_BHK.masked_fill_(~valid_BK[:, None], float("-inf"))
        o_lat_BHC = torch.bmm(s_BHK.softmax(-1).to(lat_BKL.dtype), lat_BKL[..., : self.kv_lora_rank])
        return torch.bmm(o_lat_BHC.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [B, H, Dv]

    def cheaper_impl(self, T: int, S: int, K: int | None) -> str:
        """The path with less time: multiply-adds per head, a gathered key counted 8x, and never absorbed under
        autograd.

        Decode (T=1 over a long cache) is absorbed: expanding S keys costs S*(Dn+Dv)*C per step. Prefill
        (T ~ S) is expanded: kv_b_proj runs once per key and the dense scores are one large GEMM. The absorbed
        sparse path gathers K latent rows per query (row copies and small batched GEMMs): measured on CPU with
        the proof model (T = S = 2,076 and 4,000, K = 512), expanded was 1.8-2.6x faster without grad, so a
        gathered key counts 8 multiply-adds here. With grad the gather's backward is a scatter-add into [B*S]
        rows: a training step on a 2,076-token session took 8.0 s absorbed against 2.5 s expanded, so training
        is always expanded (the same function: tests check both paths agree).
        """
        if torch.is_grad_enabled():
            return "expanded"
        C, dn, dv, dr = self.kv_lora_rank, self.dn, self.dv, self.dr
        expanded = S * (dn + dv) * C + T * S * (dn + dr + dv)
        absorbed = T * (dn * C + (K or S) * (2 * C + dr) + C * dv)
        return "absorbed" if 8 * absorbed < expanded else "expanded"

    # ---- the layer --------------------------------------------------------------------------------------
    def forward(
        self,
        x_BTD,
        cos,
        sin,
        q_idx,
        layer_cache=None,
        prev_topk=None,
        impl="auto",
        keep_last: int = 0,
        segment_ids=None,
    ):
        """x: post-input_layernorm hidden [B, T, D]. -> (output [B, T, D], topk_idx [B, T, K] or None).

        layer_cache: a `LayerCache` (model/kv_cache.py) that new entries are appended to, or None.
        prev_topk: the previous layer's selection, used when this layer's indexer is 'shared'.
        impl: 'expanded', 'absorbed', or 'auto' (`cheaper_impl`: absorbed for decode, expanded for prefill).
        keep_last: if > 0, every token's cache entries (keys) are made, but only the last `keep_last` tokens'
        queries: the output (and topk_idx) cover those rows only, [B, keep_last, ...].
        segment_ids: [B, T] ids of packed sequences (training: no cache, every row's output): attention and the
        indexer's selection stay within each segment (the expanded path).
        """
        c_kv, k_pe = self.project_kv(x_BTD, cos, sin)
        idx_k = self.indexer.keys(x_BTD, cos, sin) if self.indexer is not None else None
        if layer_cache is not None:
            c_kv, k_pe, idx_k = layer_cache.append(c_kv, k_pe, idx_k)
        if 0 < keep_last < x_BTD.shape[1]:
            x_BTD, cos, sin, q_idx = (
                x_BTD[:, -keep_last:],
                cos[:, -keep_last:],
                sin[:, -keep_last:],
                q_idx[..., -keep_last:],
            )
            prev_topk = None if prev_topk is None else prev_topk[:, -keep_last:]
        q_nope, q_pe, qr = self.project_q(x_BTD, cos, sin)
        if self.indexer is not None:
            # Without autograd: the selection is integer indices, through which no gradient flows (transformers'
            # indexer is no_grad too), and in training its [T, heads, S] scores would be kept for a backward that
            # never reads them (the main job's SFT and align-mtp spent most of their time there).
            with torch.no_grad():
                topk = self.indexer.select_from_latent(qr, cos, sin, x_BTD, idx_k, q_idx, segment_ids)
        else:
            topk = prev_topk
        if impl == "auto":
            impl = self.cheaper_impl(x_BTD.shape[1], c_kv.shape[1], None if topk is None else topk.shape[-1])
        if segment_ids is not None:
            o = self.attend_expanded(q_nope, q_pe, c_kv, k_pe, q_idx, topk, segment_ids=segment_ids)
            return self.o_proj(o.flatten(2)), topk
        attend = {"expanded": self.attend_expanded, "absorbed": self.attend_absorbed}[impl]
        o = attend(q_nope, q_pe, c_kv, k_pe, q_idx, topk)
        return self.o_proj(o.flatten(2)), topk
