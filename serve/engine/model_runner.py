"""Runs one scheduled step of the model over the paged cache: the only engine module that touches tensors.

A step is a list of chunks (sequence, n new tokens). The runner flattens their tokens into one row of
N tokens so every projection, MLP and MoE runs once for the whole step (variable-length prefill of
several sequences and decodes together), writes the new tokens' cache entries (c_kv, k_pe, index key)
into their slots, and runs attention per sequence against that sequence's blocks. Two implementations,
chosen by `EngineConfig.attn_impl`:

- "plain": the model's own modules layer by layer, and for every chunk the model's own MLA pieces on the
  sequence's gathered context (indexer top-k, then expanded attention, or absorbed attention for a decode
  or when top-k drops keys). Obviously the model's math; the reference the fast path is tested against.
- "fast": the same math with fewer, larger operations (fused_weights.py: one product for q_a / kv_a /
  indexer wk, one for each gate|up pair; one RoPE call for all rotary parts; fused norms), a host loop
  over the few experts a small step routes to, and for decode chunks one batched absorbed-MLA call: score
  each sequence's cached index keys, take the top-k, gather *only the selected* latents from the paged
  cache, pad to one [B, K] tensor, fold W_UK into the queries and W_UV after the weighted sum of latents.
  Cost per decode is O(L * Di) for the indexer plus O(K * (C + R)) for attention, not O(L * (C + R)).
  Prefill chunks use the model's attend functions as in "plain".

Then the last position of each sampling chunk goes through the final norm and lm_head, and the sampler. Nothing
else reads the last layer's output, so on the fast path that layer writes every row's cache entries but runs its
queries, attention, o_proj and MLP for the sampled rows only (one per sampling chunk, as a one-token query over
the chunk's context): a T-token prefill skips (T - 1) / T of that layer's query side and MoE. (The speculative
runner keeps every row: the MTP layer reads the last layer's hidden states at each position.)

Shapes: N tokens in the step, B decoding sequences, L context length of one sequence, K selected keys,
H heads, Dn/Dv/R nope/value/rope head dims, C kv_lora_rank, Di index head dim, D hidden, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from model import kernels
from model.kernels import fused as fused_kernels
from model.moe import swiglu
from model.rope import apply_rope
from serve.engine.config import EngineConfig
from serve.engine.fused_weights import FusedLayer, fuse_head, fuse_layer
from serve.engine.kv_cache import KVCache
from serve.engine.sampler import Sampler
from serve.engine.scheduler import ScheduledChunk
from serve.engine.sequence import TokenLogprob

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
        from model.norms import RMSNorm

        g, same = torch.Generator().manual_seed(0), True
        for n in (64, 100, 384, 768, 2048, 6144):
            norm = RMSNorm(n, 1e-5).to(dtype=dtype, device=device)
            norm.weight.data.copy_(torch.randn(n, generator=g))
            x = (torch.randn(4, n, generator=g) * 3).to(dtype=dtype, device=device)
            same &= torch.equal(F.rms_norm(x, (n,), norm.weight, norm.eps), norm(x))
        _F_RMS_NORM_SAME[key] = same
    return _F_RMS_NORM_SAME[key]


@dataclass
class SeqInput:
    """One chunk's place in the flattened step."""

    offset: int  # first row in the step's N tokens
    start: int  # position (= index in the sequence) of the first new token
    n: int  # new tokens
    block_table: torch.Tensor  # the sequence's blocks, covering positions 0..start+n-1
    block_size: int

    @property
    def ctx_len(self) -> int:
        return self.start + self.n

    @property
    def contiguous(self) -> bool:
        """Whether the blocks are consecutive (usual in a fresh pool): then the context is a view, not a copy."""
        if not hasattr(self, "_contiguous"):
            bt = self.block_table
            self._contiguous = len(bt) == 1 or bool((bt[1:] - bt[:-1] == 1).all())
        return self._contiguous

    # Context index i lives in the slot of position i + pos_offset (the MTP layer's entries start at position 1).
    pos_offset = 0

    def gather(self, paged_NPX: torch.Tensor) -> torch.Tensor:
        """This sequence's whole context [L, X] from a paged tensor: a view if its blocks are consecutive,
        else copied block by block."""
        rows = slice(self.pos_offset, self.pos_offset + self.ctx_len)
        if self.contiguous:
            first = int(self.block_table[0])
            return paged_NPX[first : first + len(self.block_table)].flatten(0, 1)[rows]
        return paged_NPX[self.block_table].flatten(0, 1)[rows]

    def slots(self, idx: torch.Tensor) -> torch.Tensor:
        """Cache slots of context indices `idx` (sequence positions idx + pos_offset)."""
        if self.contiguous:  # consecutive blocks: one add
            return idx + (int(self.block_table[0]) * self.block_size + self.pos_offset)
        pos = idx + self.pos_offset if self.pos_offset else idx
        return self.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    @property
    def rows(self) -> slice:
        return slice(self.offset, self.offset + self.n)

    @property
    def q_idx(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.n, device=self.block_table.device)


@dataclass
class StepInput:
    input_ids_N: torch.Tensor
    positions_N: torch.Tensor
    slots_N: torch.Tensor
    seqs: list[SeqInput]
    sample_rows: list[int]  # row of the last token of each sampling chunk
    # Per-step values every layer would otherwise rebuild (decode rows, dense decode slots): filled lazily.
    memo: dict = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model, engine_cfg: EngineConfig, device: torch.device | str = "cpu"):
        self.model = model.eval()
        self.cfg = model.config
        self.engine_cfg = engine_cfg
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.block_size = engine_cfg.block_size
        num_blocks = engine_cfg.num_kv_blocks or KVCache.num_blocks_for_memory(
            self.cfg, engine_cfg.block_size, self.dtype, engine_cfg.kv_cache_gib
        )
        self.kv = KVCache(self.cfg, num_blocks, engine_cfg.block_size, self.dtype, self.device)
        self.sampler = Sampler()
        self.fast = engine_cfg.attn_impl == "fast"
        self.fused: list[FusedLayer] = []
        # Latents (c_kv + k_pe of one token in one layer) read by batched decode attention: with DSA this
        # grows with index_topk, not with the context. Benchmarks and tests read it.
        self.decode_latents_read = 0
        self._rope_tab: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _rope(self, positions_N: torch.Tensor):
        """(cos, sin) [N, R/2] fp32 for the plain path and (cos, sin) [N, 1, R/2] in the model's dtype for the
        fast path, looked up in a table of every position so far (the model's rope_cos_sin over 0..P-1, grown
        by doubling): two index ops per forward instead of computing the frequencies again (a decode step of
        a small model pays per torch call, and speculative decoding calls this four times a step)."""
        top = int(positions_N.max()) + 1 if positions_N.numel() else 1
        if self._rope_tab is None or self._rope_tab[0].shape[0] < top:
            P = max(top, 2 * self._rope_tab[0].shape[0] if self._rope_tab is not None else 4096)
            cos, sin = self.model.model.rope(torch.arange(P, device=self.device))
            self._rope_tab = (cos, sin, cos[:, None].to(self.dtype), sin[:, None].to(self.dtype))
        cos, sin, cos_dt, sin_dt = self._rope_tab
        if self.fast:
            return None, None, (cos_dt[positions_N], sin_dt[positions_N])
        return cos[positions_N], sin[positions_N], (cos_dt[positions_N], sin_dt[positions_N])

    def _layers(self):
        return [self.model.model.layers[i] for i in range(self.cfg.num_hidden_layers)]

    def _ensure_fused(self) -> None:
        if len(self.fused) != self.cfg.num_hidden_layers or not all(f.is_current() for f in self.fused):
            self.fused = [fuse_layer(layer) for layer in self._layers()]
            if self.model.lm_head.weight is not self.model.model.embed_tokens.weight:  # tied: the lookup wants rows
                fuse_head(self.model.lm_head)

    # ---- step preparation -------------------------------------------------------------------------

    def prepare(self, chunks: list[ScheduledChunk]) -> StepInput:
        ids, pos, slots, seqs, sample_rows = [], [], [], [], []
        offset = 0
        for c in chunks:
            s, start = c.seq, c.seq.num_computed_tokens
            bt = torch.tensor(s.block_table, dtype=torch.long, device=self.device)
            seq_in = SeqInput(offset, start, c.num_tokens, bt, self.block_size)
            ids.extend(s.token_ids[start : start + c.num_tokens])
            new_pos = seq_in.q_idx
            pos.append(new_pos)
            slots.append(seq_in.slots(new_pos))
            seqs.append(seq_in)
            offset += c.num_tokens
            if c.sample:
                sample_rows.append(offset - 1)
        return StepInput(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.cat(pos),
            torch.cat(slots),
            seqs,
            sample_rows,
        )

    # ---- the step ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> list[TokenLogprob | None]:
        """Forward the step, sample where a chunk ends its sequence. One entry per chunk."""
        if not chunks:
            return []
        step = self.prepare(chunks)
        logits_BV = self.forward(step)
        sampling = [c.seq for c in chunks if c.sample]
        with record_function("sampler"):
            sampled = iter(self.sampler(logits_BV.cpu(), sampling) if sampling else [])
        return [next(sampled) if c.sample else None for c in chunks]

    @torch.inference_mode()
    def forward(self, step: StepInput) -> torch.Tensor:
        """Logits [len(sample_rows), V] (fp32) of the step's sampling positions."""
        m = self.model.model
        x_ND = m.embed_tokens(step.input_ids_N)
        cos, sin, rope_cs = self._rope(step.positions_N)
        prev_topk: dict[int, torch.Tensor | None] = {}
        if self.fast:
            self._ensure_fused()
        layers = self._layers()
        for i, layer in enumerate(layers):
            # record_function labels let a profiler split a step into attention / mlp / lm_head / sampler.
            if self.fast:
                # Only the sampled rows of the last layer's output are read: its queries, attention and MLP
                # run for those rows alone (`_layer_fast`), and x_ND comes back with just them.
                final = i == len(layers) - 1
                x_ND = self._layer_fast(i, layer, self.fused[i], x_ND, rope_cs, step, prev_topk, final=final)
            else:
                x_ND = self._layer_plain(i, layer, x_ND, cos, sin, step, prev_topk)
        if not step.sample_rows:
            return torch.empty(0, self.cfg.vocab_size)
        with record_function("lm_head"):
            return self.model.lm_head(m.norm(x_ND if self.fast else x_ND[step.sample_rows])).float()

    # ---- the plain path: the model's modules ----------------------------------------------------------

    def _layer_plain(self, i, layer, x_ND, cos, sin, step: StepInput, prev_topk) -> torch.Tensor:
        attn = layer.self_attn
        with record_function("attention"):
            h = layer.input_layernorm(x_ND)[None]
            cos, sin = cos[None], sin[None]
            q_nope, q_pe, qr = attn.project_q(h, cos, sin)  # [1,N,H,Dn], [1,N,H,R], [1,N,Q]
            c_kv, k_pe = attn.project_kv(h, cos, sin)  # [1,N,C], [1,N,R]
            idx_k = attn.indexer.keys(h, cos, sin)[0] if attn.indexer is not None else None
            self.kv.write(i, step.slots_N, c_kv[0], k_pe[0], idx_k)
            iq = self._index_queries(attn, qr, cos, sin, step)
            out = q_nope.new_empty(*q_nope.shape[:3], attn.dv)  # [1, N, H, Dv]
            for j, s in enumerate(step.seqs):
                topk = self._select(i, j, attn, iq, h, s, prev_topk)
                out[:, s.rows] = self._attend_context(i, attn, q_nope[:, s.rows], q_pe[:, s.rows], s, topk)
            x_ND = x_ND + attn.o_proj(out.flatten(2))[0]
        with record_function("mlp"):
            return x_ND + layer.mlp(layer.post_attention_layernorm(x_ND))

    # ---- pieces both paths share ------------------------------------------------------------------------

    def _index_queries(self, attn, qr_1NQ, cos_1N, sin_1N, step: StepInput):
        """Index queries, only when some context exceeds the budget (else all keys are kept) -> (queries
        [1, N - r0, I, Di] of rows r0.., r0) or None. Rows before r0 need none: a row that sees fewer than K
        keys selects them all (`Indexer.select`), which is the first K - start rows of a chunk starting at
        `start`: half the rows of a 2K prompt prefilled with K = 1K."""
        ix = attn.indexer
        if ix is None:
            return None
        firsts = [s.offset + max(0, min(s.n, ix.topk - s.start)) for s in step.seqs if s.ctx_len > ix.topk]
        if not firsts:
            return None
        r0 = min(firsts)
        return ix.queries(qr_1NQ[:, r0:], cos_1N[:, r0:], sin_1N[:, r0:]), r0

    def _select(self, i, j, attn, iq, h_1ND, s: SeqInput, prev_topk):
        """DSA for sequence j in layer i: the indexer scores this sequence's cached index keys and keeps the
        top-k ([1, n, K] positions), or None when every key fits in the budget."""
        ix = attn.indexer
        if ix is None:
            topk = prev_topk.get(j)  # a 'shared' indexer layer reuses the previous layer's pick
        elif s.ctx_len <= ix.topk:
            topk = None
        else:
            keys = s.gather(self.kv.index_k_NPD[i])[None]
            q, r0 = iq  # queries of rows r0.. (`_index_queries`): this chunk's from row max(offset, r0) on
            lo = max(s.offset, r0)
            q = q[:, lo - r0 : s.offset + s.n - r0]
            topk = ix.select(q, h_1ND[:, s.rows], keys, s.q_idx, q_offset=lo - s.offset)
        prev_topk[j] = topk
        return topk

    def _attend_context(self, i, attn, q_nope, q_pe, s: SeqInput, topk, expanded: bool = False, out=None):
        """The model's own attention for one chunk over its gathered context. -> [1, n, H, Dv].

        By default the same rule as the model's forward (so engine and plain model agree to rounding):
        absorbed for a decode or when top-k drops keys, else expanded. `expanded` forces the expanded
        path, with top-k as a mask (the same function of the inputs; tests check the two agree), and writes
        into `out` ([1, n, H, Dv]) when given."""
        latent = s.gather(self.kv.latent_NPK[i])[None]
        c_ctx, pe_ctx = latent.split([self.kv.C, self.kv.R], -1)
        if expanded:
            return attn.attend_expanded(q_nope, q_pe, c_ctx, pe_ctx, s.q_idx, topk, out=out)
        attend = attn.attend_absorbed if s.n == 1 or topk is not None else attn.attend_expanded
        return attend(q_nope, q_pe, c_ctx, pe_ctx, s.q_idx, topk)

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
        attn, cfg = layer.self_attn, self.cfg
        N = x_ND.shape[0]
        H, Dn, R, C = attn.n_heads, attn.dn, attn.dr, attn.kv_lora_rank
        Q, Di = cfg.q_lora_rank, cfg.index_head_dim
        with record_function("attention"):
            ln = layer.input_layernorm
            h = rms_norm(ln, x_ND)
            ix = attn.indexer
            if fused.w_in is not None:
                qa, c_kv, k_pe, ik = F.linear(h, fused.w_in).split([Q, C, R, Di], -1)
            else:
                qa = attn.q_a_proj(h)
                c_kv, k_pe = attn.kv_a_proj_with_mqa(h).split([C, R], -1)
                ik = ix.wk(h) if ix is not None else None
            if final:  # the cache entries for every row, everything else for the sampled rows (docstring)
                kv_step = step
                step, keep, prev_topk = self._final_rows(step, prev_topk)
                N, x_ND, h, qa = len(keep), x_ND[keep], h[keep], qa[keep]
                rope_q = (rope_cs[0][keep], rope_cs[1][keep])
            qn = attn.q_a_layernorm
            qr = rms_norm(qn, qa)
            q = attn.q_b_proj(qr).view(N, H, Dn + R)
            kn = attn.kv_a_layernorm
            c_kv = rms_norm(kn, c_kv)
            rot = [k_pe[:, None]] if final else [q[..., Dn:], k_pe[:, None]]
            if ik is not None:
                norm = ix.k_norm
                ik = F.layer_norm(ik.float(), (Di,), norm.weight.float(), norm.bias.float(), norm.eps).to(h.dtype)
                rot.append(ik[:, None, :R])
            # One RoPE call for the query heads, the MLA rotary key and the indexer key's rotary half (two in the
            # final layer, whose queries are fewer rows than its keys).
            rot = apply_rope(torch.cat(rot, 1), *rope_cs)
            if final:
                k_pe, q_pe = rot[:, 0], apply_rope(q[..., Dn:], *rope_q)
                if ik is not None:
                    ik = torch.cat([rot[:, 1], ik[:, R:]], -1)
                self.kv.write(i, kv_step.slots_N, c_kv, k_pe, ik)
                rope_cs = rope_q
                if N == 0:  # no chunk samples: the cache entries were all this layer had to give
                    return x_ND
            else:
                q_pe, k_pe = rot[:, :H], rot[:, H]
                if ik is not None:
                    ik = torch.cat([rot[:, H + 1], ik[:, R:]], -1)
                self.kv.write(i, step.slots_N, c_kv, k_pe, ik)
            q_nope = q[..., :Dn]

            cos, sin = rope_cs
            iq = self._index_queries(attn, qr[None], cos[None, :, 0], sin[None, :, 0], step)
            out = q.new_empty(N, H, attn.dv)
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
                out[rows] = self.absorbed_attend(attn, q_nope[rows], q_pe[rows], lat_BKL, valid_BK)
            # The residual sums go into the sublayers' fresh outputs (addition commutes exactly: the same bits).
            # The residual sum and the MLP's input norm (one fused pass on CPU).
            x_ND, h = layer.post_attention_layernorm.add_forward(attn.o_proj(out.view(N, -1)), x_ND)
        with record_function("mlp"):
            return self._mlp_fast(layer.mlp, fused, h).add_(x_ND)

    @staticmethod
    def _swiglu(x, gate_up, mlp):
        if gate_up is None:
            return mlp(x)
        g, u = F.linear(x, gate_up).chunk(2, -1)
        return mlp.down_proj(swiglu(g, u))  # in place on the GEMM's own fresh output

    def _mlp_fast(self, mlp, fused: FusedLayer, h_ND):
        if not hasattr(mlp, "experts"):
            return self._swiglu(h_ND, fused.gate_up[0], mlp)
        w_Nk, idx_Nk = mlp.gate(h_ND)  # the model's router (fp32 scores, bias for selection only)
        out = self._swiglu(h_ND, fused.shared_gate_up, mlp.shared_experts)
        N, k = idx_Nk.shape
        if N <= 2:
            # A decode step of one or two tokens touches at most 2k experts: call them directly, no sort.
            for t, (experts, weights) in enumerate(zip(idx_Nk.tolist(), w_Nk.tolist(), strict=True)):
                for e, wt in zip(experts, weights, strict=True):
                    out[t].add_(self._swiglu(h_ND[t], fused.gate_up[e], mlp.experts[e]), alpha=wt)
            return out
        if fused.stacked:  # the experts' own stacked weights: two grouped GEMMs for the whole step
            return mlp.routed_stacked(h_ND, w_Nk, idx_Nk, out=out)
        flat = idx_Nk.flatten()
        order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert
        token = order // k
        counts = torch.bincount(flat, minlength=len(mlp.experts)).tolist()
        xs = h_ND[token]
        ys, start = [], 0
        for e, n in enumerate(counts):
            if n:
                ys.append(self._swiglu(xs[start : start + n], fused.gate_up[e], mlp.experts[e]))
                start += n
        routed = torch.cat(ys) * w_Nk.flatten()[order, None].to(h_ND.dtype)
        return out.index_add_(0, token, routed)

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
            out[r] = self.absorbed_attend(
                attn, q_nope_THD[r], q_pe_THR[r], lat, None if valid_TK is None else valid_TK[r]
            )
        return out

    @staticmethod
    def _gather_rows(latent_flat, slots_BK) -> torch.Tensor:
        """[B, K, C + R]: only the given slots are read from the paged cache (one row copy each).

        `F.embedding` is a plain row gather; on CPU it runs 2-4x faster than `index_select` for ~2K rows of
        ~300 values out of a large pool (measured: 0.3 vs 0.7-1.4 ms, 1 thread)."""
        return F.embedding(slots_BK.flatten(), latent_flat).view(*slots_BK.shape, -1)

    @staticmethod
    def absorbed_attend(attn, q_nope_BHD, q_pe_BHR, lat_BKL, valid_BK=None) -> torch.Tensor:
        """Absorbed MLA for B single queries, each over its own K latents [c_kv | k_pe]. -> [B, H, Dv].

        Invalid keys (padding, future positions) are masked out of the softmax. Scores use
        [q_nope W_UK | q_pe] against the stored [c_kv | k_pe] in one product; the weighted sum of latents is
        mapped to values by W_UV afterwards."""
        w = attn._kv_b_weight()  # [H, Dn + Dv, C]
        w_uk, w_uv = w[:, : attn.dn], w[:, attn.dn :]
        q_abs_BHC = torch.bmm(q_nope_BHD.transpose(0, 1), w_uk).transpose(0, 1)  # [B, H, C]
        q_BHL = torch.cat([q_abs_BHC, q_pe_BHR], -1)
        s_BHK = torch.bmm(q_BHL, lat_BKL.transpose(1, 2)).float().mul_(attn.scale)
        if valid_BK is not None:
            s_BHK.masked_fill_(~valid_BK[:, None], float("-inf"))
        o_lat_BHC = torch.bmm(s_BHK.softmax(-1).to(lat_BKL.dtype), lat_BKL[..., : attn.kv_lora_rank])
        return torch.bmm(o_lat_BHC.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [B, H, Dv]
