"""Runs one scheduled step of the model over the paged cache: the only engine module that touches tensors.

A step is a list of chunks (sequence, n new tokens). The runner flattens their tokens into one row of
N tokens so every projection, MLP and MoE runs once for the whole step (variable-length prefill of
several sequences and decodes together), writes the new tokens' cache entries (c_kv, k_pe, index key)
into their slots, and runs attention per sequence against that sequence's blocks. Two implementations,
chosen by `EngineConfig.attn_impl`:

- "plain": the model's own modules layer by layer, and for every chunk the model's own MLA pieces on the
  sequence's gathered context (indexer top-k, then expanded attention, or absorbed attention for a decode
  or when top-k drops keys). Obviously the model's math; the reference the fast path is tested against.
- "fast" (fast_layer.py, a mixin of this class): the model's layer with fewer, larger operations (fused
  projections, one RoPE call, fused norms, the model's MoE routing over fused expert weights) and one batched
  absorbed-MLA call over only the selected latents for the step's decodes. Prefill chunks use the model's
  attend functions as in "plain".

Then the last position of each sampling chunk goes through the final norm and lm_head, and the sampler. Nothing
else reads the last layer's output, so on the fast path that layer writes every row's cache entries but runs its
queries, attention, o_proj and MLP for the sampled rows only (one per sampling chunk, as a one-token query over
the chunk's context): a T-token prefill skips (T - 1) / T of that layer's query side and MoE. (The speculative
runner keeps every row: the MTP layer reads the last layer's hidden states at each position.)

Shapes: N tokens in the step, B decoding sequences, L context length of one sequence, K selected keys,
H heads, Dn/Dv/R nope/value/rope head dims, C kv_lora_rank, Di index head dim, D hidden, V vocab.
"""

from __future__ import annotations

import torch
from torch.profiler import record_function

from serve.engine.config import EngineConfig
from serve.engine.fast_layer import FastPath
from serve.engine.fused_weights import FusedLayer, fuse_head, fuse_layer
from serve.engine.kv_cache import KVCache
from serve.engine.sampler import Sampler
from serve.engine.scheduler import ScheduledChunk
from serve.engine.sequence import TokenLogprob
from serve.engine.step_input import SeqInput, StepInput


class ModelRunner(FastPath):
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
