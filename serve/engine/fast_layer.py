"""The runner's fast path: the model's decoder layer over a flattened step, with fewer, larger operations.

Fusions only, each declared in fused_weights.py or here: one product for q_a / kv_a / indexer wk and one for each
gate|up pair (fused_weights.py); one RoPE call for all rotary parts; the fused RMSNorm kernels (`rms_norm`, the
module's bits); the experts through the model's own routing (`MoE.routed_stacked` / `MoE.routed_each`, each expert a
fused gate|up product); and for decode chunks one batched absorbed-MLA call: score each sequence's cached index
keys, take the top-k, gather *only the selected* latents from the paged cache, pad to one [B, K] tensor, and attend
with the model's `MLA.attend_absorbed_latents` (W_UK folded into the queries, W_UV after the weighted sum of
latents). Cost per decode is O(L * Di) for the indexer plus O(K * (C + R)) for attention, not O(L * (C + R)).
Prefill chunks use the model's attend functions as the plain path does. The plain path (model_runner.py, the model's
modules) is the reference it is tested against.

Shapes: N tokens in the step, B decoding sequences, L context length of one sequence, K selected keys,
H heads, Dn/Dv/R nope/value/rope head dims, C kv_lora_rank, Di index head dim, D hidden, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from model import kernels
from model.kernels import fused as fused_kernels
from model.moe import swiglu
from model.norms import RMSNorm
from model.rope import apply_rope
from serve.engine.fused_weights import FusedLayer
from serve.engine.step_input import SeqInput, StepInput

# Values gathered at once by sparse prefill ([queries, K, C + R]): 16M floats = 64 MB in fp32.
_GATHER_VALUES = 1 << 24


def rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm module on the fast path. In fp32 on CPU: the fused kernel (model/kernels; 7 us for
    1 x 768, 0.15 ms for 512 x 768). Otherwise, up to ~64K values (decode steps): F.rms_norm, one call where the
    module makes six (9 vs 13 us for 1 x 768, 12 vs 16 us for 16 x 768); more (a prefill chunk): the module's
    in-place inference path, since torch's CPU rms_norm falls far behind there (0.93 vs 0.28 ms for 512 x 768;
    measured, 1 thread). F.rms_norm is taken only where it gives the module's bits on this machine (checked once:
    its reduction order is torch's per CPU build), so every path gives the same bits (tests check)."""
    y = (
        fused_kernels.rms_norm(x, norm.weight, norm.eps) if kernels.fused_on() else None
    )  # fp32 on CPU: one fused kernel, the same bits again
    if y is not None:
        return y
    if x.numel() <= 65536 and _f_rms_norm_is_the_modules(x.dtype, x.device):
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)
    return norm(x)


_F_RMS_NORM_SAME: dict[tuple[torch.dtype, str], bool] = {}


def _f_rms_norm_is_the_modules(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether F.rms_norm equals RMSNorm's inference path bit for bit here, on rows of several widths."""
    key = (dtype, device.type)
    if key not in _F_RMS_NORM_SAME:
        g, same = torch.Generator().manual_seed(0), True
        for n in (64, 100, 384, 768, 2048, 6144):
            norm = RMSNorm(n, 1e-5).to(dtype=dtype, device=device)
            norm.weight.data.copy_(torch.randn(n, generator=g))
            x = (torch.randn(4, n, generator=g) * 3).to(dtype=dtype, device=device)
            same &= torch.equal(F.rms_norm(x, (n,), norm.weight, norm.eps), norm(x))
        _F_RMS_NORM_SAME[key] = same
    return _F_RMS_NORM_SAME[key]


def _swiglu(x, gate_up, mlp):
    """An MLP (an expert) on x: with its gate|up weights fused, one product and the model's swiglu."""
    if gate_up is None:
        return mlp(x)
    g, u = F.linear(x, gate_up).chunk(2, -1)
    return mlp.down_proj(swiglu(g, u))  # in place on the GEMM's own fresh output


class FastPath:
    """The fast path's methods of ModelRunner (`EngineConfig.attn_impl == "fast"`); the runner holds the state
    (kv, fused, device, engine_cfg) and the pieces both paths share (`_index_queries`, `_select`,
    `_attend_context`)."""

    def _use_gather(self, attn, s: SeqInput, K: int) -> bool:
        """For a prefill chunk whose top-k drops keys (EngineConfig.sparse_prefill "auto"): gather each query's K latents (work ~ n*K, but a
        random row gather moves memory slowly: weighted as 32 multiply-adds per value) or expand the whole
        context and mask (work ~ n*L)? Expansion wins up to contexts of ~5-10x K on CPU."""
        if self.engine_cfg.sparse_prefill != "auto":
            return self.engine_cfg.sparse_prefill == "gather"
        n, L, H, C, R = s.n, s.ctx_len, attn.n_heads, attn.kv_lora_rank, attn.dr
        expanded = L * C * H * (attn.dn + attn.dv) + n * L * H * (attn.dn + R + attn.dv)
        gathered = n * K * (C + R) * 32 + n * K * H * (2 * C + R)
        return gathered < expanded

    # ---- the fast path ------------------------------------------------------------------------------

    def _final_rows(self, step: StepInput, prev_topk: dict):
        """The step as the last layer needs it when only the sampled rows' outputs are read: one single-token
        query per sampling chunk (its last position, over the chunk's whole context, which this layer's cache
        write has just completed). -> (that step, the rows it keeps [n], their 'shared'-indexer selections)."""
        keep = set(step.sample_rows)
        seqs, prev = [], {}
        for j, s in enumerate(step.seqs):
            if s.offset + s.n - 1 in keep:
                t = prev_topk.get(j)
                prev[len(seqs)] = None if t is None else t[:, -1:]
                seqs.append(SeqInput(len(seqs), s.start + s.n - 1, 1, s.block_table, s.block_size))
        rows = torch.tensor(step.sample_rows, dtype=torch.long, device=self.device)
        final = StepInput(
            step.input_ids_N[rows], step.positions_N[rows], step.slots_N[rows], seqs, list(range(len(seqs)))
        )
        return final, rows, prev

    def _layer_fast(
        self, i, layer, fused: FusedLayer, x_ND, rope_cs, step: StepInput, prev_topk, final: bool = False
    ) -> torch.Tensor:
        """One decoder layer over the step's rows -> hidden [N, D]. With `final` (the last layer, whose output
        is read only at the sampled rows): every row's cache entries are written, but queries, attention, o_proj
        and MLP run only for `step.sample_rows`, and only those rows come back ([len(sample_rows), D], in order).
        The same values for those rows, to rounding: a prefill of T tokens skips (T - 1) / T of the layer's
        query side and MLP (llama.cpp skips the unused rows after attention; here they skip attention too)."""
        attn = layer.self_attn
        H, Dn, R = attn.n_heads, attn.dn, attn.dr
        with record_function("attention"):
            h = rms_norm(layer.input_layernorm, x_ND)
            qa, c_kv, k_pe, ik = self._project_latents(attn, fused, h)
            kv_step, rope_q = step, rope_cs
            if final:  # the cache entries for every row, everything else for the sampled rows (docstring)
                step, keep, prev_topk = self._final_rows(step, prev_topk)
                x_ND, h, qa = x_ND[keep], h[keep], qa[keep]
                rope_q = (rope_cs[0][keep], rope_cs[1][keep])
            N = x_ND.shape[0]
            qr = rms_norm(attn.q_a_layernorm, qa)
            q = attn.q_b_proj(qr).view(N, H, Dn + R)
            c_kv = rms_norm(attn.kv_a_layernorm, c_kv)
            if ik is not None:
                norm = attn.indexer.k_norm
                Di = self.cfg.index_head_dim
                ik = F.layer_norm(ik.float(), (Di,), norm.weight.float(), norm.bias.float(), norm.eps).to(h.dtype)
            q_pe, k_pe, ik = self._rope_fast(q, k_pe, ik, rope_cs, rope_q, final, Dn, R)
            self.kv.write(i, kv_step.slots_N, c_kv, k_pe, ik)
            if final and N == 0:  # no chunk samples: the cache entries were all this layer had to give
                return x_ND
            out = self._attention_fast(i, attn, q[..., :Dn], q_pe, qr, h, rope_q, step, prev_topk)
            # The residual sums go into the sublayers' fresh outputs (addition commutes exactly: the same bits).
            # The residual sum and the MLP's input norm (one fused pass on CPU).
            x_ND, h = layer.post_attention_layernorm.add_forward(attn.o_proj(out.view(N, -1)), x_ND)
        with record_function("mlp"):
            return self._mlp_fast(layer.mlp, fused, h).add_(x_ND)

    def _project_latents(self, attn, fused: FusedLayer, h):
        """The layer's input projections -> (q-LoRA latent, c_kv, k_pe, index key or None), unnormalised: one
        product when they are fused."""
        C, R = attn.kv_lora_rank, attn.dr
        ix = attn.indexer
        if fused.w_in is not None:
            return F.linear(h, fused.w_in).split([self.cfg.q_lora_rank, C, R, self.cfg.index_head_dim], -1)
        qa = attn.q_a_proj(h)
        c_kv, k_pe = attn.kv_a_proj_with_mqa(h).split([C, R], -1)
        return qa, c_kv, k_pe, (ix.wk(h) if ix is not None else None)

    @staticmethod
    def _rope_fast(q, k_pe, ik, rope_cs, rope_q, final: bool, Dn: int, R: int):
        """One RoPE call for the query heads, the MLA rotary key and the indexer key's rotary half (two in the
        final layer, whose queries are fewer rows than its keys). -> (q_pe, k_pe, index key)."""
        H = q.shape[1]
        rot = [k_pe[:, None]] if final else [q[..., Dn:], k_pe[:, None]]
        if ik is not None:
            rot.append(ik[:, None, :R])
        rot = apply_rope(torch.cat(rot, 1), *rope_cs)
        if final:
            k_pe, q_pe = rot[:, 0], apply_rope(q[..., Dn:], *rope_q)
            if ik is not None:
                ik = torch.cat([rot[:, 1], ik[:, R:]], -1)
            return q_pe, k_pe, ik
        q_pe, k_pe = rot[:, :H], rot[:, H]
        if ik is not None:
            ik = torch.cat([rot[:, H + 1], ik[:, R:]], -1)
        return q_pe, k_pe, ik

    def _attention_fast(self, i, attn, q_nope, q_pe, qr, h, rope_cs, step: StepInput, prev_topk) -> torch.Tensor:
        """Attention for every chunk of the step -> [N, H, Dv]: decodes batched, prefills per chunk."""
        ix = attn.indexer
        cos, sin = rope_cs
        iq = self._index_queries(attn, qr[None], cos[None, :, 0], sin[None, :, 0], step)
        out = q_nope.new_empty(q_nope.shape[0], attn.n_heads, attn.dv)
        decodes: list[tuple[SeqInput, torch.Tensor | None]] = []
        if self._all_dense_decodes(step, ix, iq, prev_topk):  # the usual decode step: no per-sequence work
            decodes = step.memo.setdefault("dense_decodes", [(s, None) for s in step.seqs])
        for j, s in enumerate(step.seqs if not decodes else ()):
            topk = self._select(i, j, attn, iq, h[None], s, prev_topk)
            if s.n == 1:
                decodes.append((s, topk))
            elif topk is not None and self._use_gather(attn, s, topk.shape[-1]):
                out[s.rows] = self._sparse_prefill(i, attn, q_nope[s.rows], q_pe[s.rows], s, topk[0])
            else:  # dense causal, or top-k applied as a mask on expanded attention (cheaper here)
                qn, qp = q_nope[None, s.rows], q_pe[None, s.rows]
                self._attend_context(i, attn, qn, qp, s, topk, expanded=True, out=out[None, s.rows])
        if decodes:
            self._attend_decodes(i, attn, decodes, step, q_nope, q_pe, out)
        return out

    def _attend_decodes(self, i, attn, decodes, step: StepInput, q_nope, q_pe, out) -> None:
        """One batched absorbed-MLA call for the step's decodes, over only their selected latents (into `out`)."""
        if "rows" not in step.memo:
            step.memo["rows"] = torch.tensor([s.offset for s, _ in decodes], device=self.device)
        rows = step.memo["rows"]
        latent = self.kv.latent_flat(i)
        if len(decodes) == 1 and decodes[0][1] is None:  # one dense decode: its context as is
            lat_BKL, valid_BK = decodes[0][0].gather(self.kv.latent_NPK[i])[None], None
            self.decode_latents_read += lat_BKL.shape[1]
        else:
            slots_BK, valid_BK, n_read = self._decode_slots(decodes, step)
            self.decode_latents_read += n_read
            lat_BKL = self._gather_rows(latent, slots_BK)
        out[rows] = attn.attend_absorbed_latents(q_nope[rows], q_pe[rows], lat_BKL, valid_BK)

    @staticmethod
    def _mlp_fast(mlp, fused: FusedLayer, h_ND):
        """The layer's MLP or MoE, through the model's routing, each expert on its fused gate|up weight."""
        if not hasattr(mlp, "experts"):
            return _swiglu(h_ND, fused.gate_up[0], mlp)
        w_Nk, idx_Nk = mlp.gate(h_ND)  # the model's router (fp32 scores, bias for selection only)
        out = _swiglu(h_ND, fused.shared_gate_up, mlp.shared_experts)
        if fused.stacked and h_ND.shape[0] > 2:  # the experts' own stacked weights: two grouped GEMMs
            return mlp.routed_stacked(h_ND, w_Nk, idx_Nk, out=out)
        return mlp.routed_each(h_ND, w_Nk, idx_Nk, out, lambda e, x: _swiglu(x, fused.gate_up[e], mlp.experts[e]))

    @staticmethod
    def _all_dense_decodes(step: StepInput, ix, iq, prev_topk) -> bool:
        """Every chunk is a one-token decode and no sequence's context exceeds this layer's DSA budget (its
        indexer made no queries, or a 'shared' layer inherits no selection): each attends to its whole
        context, and `_select` would only record None for each."""
        if not step.memo.setdefault("all_decode", all(s.n == 1 for s in step.seqs)):
            return False
        if ix is not None and iq is not None:
            return False
        if ix is None and any(t is not None for t in prev_topk.values()):
            return False
        prev_topk.update(dict.fromkeys(range(len(step.seqs))))  # what `_select` records: no selection
        return True

    def _decode_slots(self, decodes, step: StepInput):
        """Cache slots [B, K] (+ validity, + count) that a batch of decodes attends to: each sequence's top-k,
        or its whole context when nothing is dropped. Without any top-k the slots are the same in every
        layer, so they are built once per step."""
        dense = all(t is None for _, t in decodes)
        if dense and "dense_slots" in step.memo:
            return step.memo["dense_slots"]
        # Top-k positions sorted, so the gather walks the cache forward (same result, better locality).
        selected = [
            s.slots(torch.arange(s.ctx_len, device=self.device) if t is None else t[0, 0].sort().values)
            for s, t in decodes
        ]
        res = (*self._pad(selected), sum(len(x) for x in selected))
        if dense:
            step.memo["dense_slots"] = res
        return res

    def _pad(self, selected: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slot lists of different lengths -> [B, K] slots and validity (None when nothing is padded)."""
        if len(selected) == 1:
            return selected[0][None], None
        B, K = len(selected), max(len(x) for x in selected)
        slots_BK = torch.zeros(B, K, dtype=torch.long, device=self.device)
        valid_BK = torch.zeros(B, K, dtype=torch.bool, device=self.device)
        for b, x in enumerate(selected):
            slots_BK[b, : len(x)] = x
            valid_BK[b, : len(x)] = True
        return slots_BK, valid_BK

    def _sparse_prefill(self, i, attn, q_nope_THD, q_pe_THR, s: SeqInput, topk_TK) -> torch.Tensor:
        """Prefill rows whose top-k drops keys: each query attends to its own K selected latents, gathered
        row by row from the paged cache (slices of queries bound the [t, K, C + R] gather). Early rows pick
        up masked future positions when fewer than K keys are visible; they are masked again here."""
        # Rows that see more than K keys picked visible ones only (indexer.select): no re-mask needed.
        valid_TK = None if s.start >= topk_TK.shape[1] else topk_TK <= s.q_idx[:, None]
        slots_TK = s.slots(topk_TK)
        latent = self.kv.latent_flat(i)
        out = q_nope_THD.new_empty(q_nope_THD.shape[0], attn.n_heads, attn.dv)
        step = max(1, _GATHER_VALUES // (topk_TK.shape[1] * latent.shape[1]))
        for t0 in range(0, topk_TK.shape[0], step):
            r = slice(t0, t0 + step)
            lat = self._gather_rows(latent, slots_TK[r])
            valid = None if valid_TK is None else valid_TK[r]
            out[r] = attn.attend_absorbed_latents(q_nope_THD[r], q_pe_THR[r], lat, valid)
        return out

    @staticmethod
    def _gather_rows(latent_flat, slots_BK) -> torch.Tensor:
        """[B, K, C + R]: only the given slots are read from the paged cache (one row copy each).

        `F.embedding` is a plain row gather; on CPU it runs 2-4x faster than `index_select` for ~2K rows of
        ~300 values out of a large pool (measured: 0.3 vs 0.7-1.4 ms, 1 thread)."""
        return F.embedding(slots_BK.flatten(), latent_flat).view(*slots_BK.shape, -1)
