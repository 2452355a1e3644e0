"""Runs one scheduled step of the model over the paged cache: the only engine module that touches tensors.

A step is a list of chunks (sequence, n new tokens). The runner flattens their tokens into one row of
N tokens so every projection, MLP and MoE runs once for the whole step (variable-length prefill of
several sequences and decodes together), writes the new tokens' cache entries (c_kv, k_pe, index key)
into their slots, and runs attention per sequence against that sequence's blocks:

- prefill chunks (n > 1): gather the sequence's context from its blocks and call the model's own MLA
  pieces (indexer top-k, then expanded attention, or absorbed attention when top-k drops keys);
- decode chunks (n == 1), fast path ("batched"): score the indexer keys of each sequence, take the
  top-k, gather *only the selected* latents and rotary keys from the paged cache, pad the sequences to
  one [B, K] tensor, and run absorbed MLA for all of them at once (W_UK folded into the query, W_UV
  applied after the weighted sum of latents). Cost per decode is O(L * Di) for the indexer plus
  O(K * (C + R)) for attention, instead of O(L * (C + R)) for dense attention;
- decode chunks, plain path ("plain"): the same per-sequence code as prefill (the model's own
  `attend_absorbed` over the gathered context); the batched path is tested against it.

Then the last position of each sampling chunk goes through the final norm and lm_head, and the sampler.

Shapes: N tokens in the step, B decoding sequences, L context length of one sequence, K selected keys,
H heads, Dn/Dv/R nope/value/rope head dims, C kv_lora_rank, Di index head dim, D hidden, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serve.engine.config import EngineConfig
from serve.engine.kv_cache import KVCache
from serve.engine.sampler import Sampler
from serve.engine.scheduler import ScheduledChunk
from serve.engine.sequence import TokenLogprob


@dataclass
class SeqInput:
    """One chunk's place in the flattened step."""

    offset: int  # first row in the step's N tokens
    start: int  # position (= index in the sequence) of the first new token
    n: int  # new tokens
    ctx_slots_L: torch.Tensor  # cache slot of every position 0..start+n-1

    @property
    def rows(self) -> slice:
        return slice(self.offset, self.offset + self.n)

    @property
    def q_idx(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.n)


@dataclass
class StepInput:
    input_ids_N: torch.Tensor
    positions_N: torch.Tensor
    slots_N: torch.Tensor
    seqs: list[SeqInput]
    sample_rows: list[int]  # row of the last token of each sampling chunk


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
        # Latents (c_kv + k_pe of one token in one layer) read by batched decode attention: with DSA this
        # grows with index_topk, not with the context. Benchmarks and tests read it.
        self.decode_latents_read = 0

    # ---- step preparation -------------------------------------------------------------------------

    def _ctx_slots(self, block_table: list[int], length: int) -> torch.Tensor:
        P = self.block_size
        bt = torch.tensor(block_table, dtype=torch.long)
        return (bt[:, None] * P + torch.arange(P)).flatten()[:length]

    def prepare(self, chunks: list[ScheduledChunk]) -> StepInput:
        ids, pos, slots, seqs, sample_rows = [], [], [], [], []
        offset = 0
        for c in chunks:
            s, start = c.seq, c.seq.num_computed_tokens
            ctx = self._ctx_slots(s.block_table, start + c.num_tokens)
            ids.extend(s.token_ids[start : start + c.num_tokens])
            pos.append(torch.arange(start, start + c.num_tokens))
            slots.append(ctx[start:])
            seqs.append(SeqInput(offset, start, c.num_tokens, ctx))
            offset += c.num_tokens
            if c.sample:
                sample_rows.append(offset - 1)
        return StepInput(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.cat(pos).to(self.device),
            torch.cat(slots).to(self.device),
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
        sampled = iter(self.sampler(logits_BV, sampling) if sampling else [])
        return [next(sampled) if c.sample else None for c in chunks]

    def forward(self, step: StepInput) -> torch.Tensor:
        """Logits [len(sample_rows), V] (fp32) of the step's sampling positions."""
        m = self.model.model
        x = m.embed_tokens(step.input_ids_N[None])  # [1, N, D]
        cos, sin = m.rope(step.positions_N[None])
        prev_topk: dict[int, torch.Tensor | None] = {}
        for layer_idx in range(self.cfg.num_hidden_layers):
            layer = m.layers[layer_idx]
            x = x + self._attention(layer_idx, layer.self_attn, layer.input_layernorm(x), cos, sin, step, prev_topk)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if not step.sample_rows:
            return torch.empty(0, self.cfg.vocab_size)
        h = m.norm(x[0, step.sample_rows])
        return self.model.lm_head(h).float()

    def _attention(self, layer_idx, attn, h_1ND, cos, sin, step: StepInput, prev_topk) -> torch.Tensor:
        q_nope, q_pe, qr = attn.project_q(h_1ND, cos, sin)  # [1,N,H,Dn], [1,N,H,R], [1,N,Q]
        c_kv, k_pe = attn.project_kv(h_1ND, cos, sin)  # [1,N,C], [1,N,R]
        indexer = attn.indexer
        idx_k = indexer.keys(h_1ND, cos, sin)[0] if indexer is not None else None
        self.kv.write(layer_idx, step.slots_N, c_kv[0], k_pe[0], idx_k)
        iq = indexer.queries(qr, cos, sin) if indexer is not None else None  # [1, N, I, Di]
        c_flat, pe_flat, ik_flat = self.kv.flat(layer_idx)

        out = q_nope.new_empty(*q_nope.shape[:3], attn.dv)  # [1, N, H, Dv]
        batched = self.engine_cfg.attn_impl == "batched"
        decodes: list[tuple[int, SeqInput, torch.Tensor | None]] = []
        for i, s in enumerate(step.seqs):
            q_idx = s.q_idx
            # DSA: the indexer scores this sequence's cached index keys and keeps the top-k (None: all fit).
            if indexer is not None:
                topk = indexer.select(iq[:, s.rows], h_1ND[:, s.rows], ik_flat[s.ctx_slots_L][None], q_idx)
            else:
                topk = prev_topk.get(i)  # a 'shared' indexer layer reuses the previous layer's pick
            prev_topk[i] = topk
            if batched and s.n == 1:
                decodes.append((i, s, topk))
                continue
            c_ctx, pe_ctx = c_flat[s.ctx_slots_L][None], pe_flat[s.ctx_slots_L][None]
            # Same rule as the model's own forward, so engine and plain model agree to rounding.
            absorbed = s.n == 1 or topk is not None
            attend = attn.attend_absorbed if absorbed else attn.attend_expanded
            out[:, s.rows] = attend(q_nope[:, s.rows], q_pe[:, s.rows], c_ctx, pe_ctx, q_idx, topk)
        if decodes:
            rows = torch.tensor([s.offset for _, s, _ in decodes])
            selected = [s.ctx_slots_L if topk is None else s.ctx_slots_L[topk[0, 0]] for _, s, topk in decodes]
            out[0, rows] = self.absorbed_decode(attn, q_nope[0, rows], q_pe[0, rows], c_flat, pe_flat, selected)
        return attn.o_proj(out.flatten(2))

    def absorbed_decode(self, attn, q_nope_BHD, q_pe_BHR, c_flat, pe_flat, selected: list[torch.Tensor]):
        """Absorbed MLA for B single-token queries, each over its own selected cache slots. -> [B, H, Dv].

        Only the selected slots are read from the paged cache; sequences are padded to the longest
        selection and the padding is masked out of the softmax."""
        B, K = len(selected), max(len(s) for s in selected)
        slots_BK = torch.zeros(B, K, dtype=torch.long)
        valid_BK = torch.zeros(B, K, dtype=torch.bool)
        for b, s in enumerate(selected):
            slots_BK[b, : len(s)] = s
            valid_BK[b, : len(s)] = True
        c_BKC, pe_BKR = c_flat[slots_BK], pe_flat[slots_BK]
        self.decode_latents_read += sum(len(s) for s in selected)
        w = attn._kv_b_weight()  # [H, Dn + Dv, C]
        w_uk, w_uv = w[:, : attn.dn], w[:, attn.dn :]
        q_abs_BHC = torch.einsum("bhd,hdc->bhc", q_nope_BHD, w_uk)
        s_BHK = torch.bmm(q_abs_BHC, c_BKC.transpose(1, 2)) + torch.bmm(q_pe_BHR, pe_BKR.transpose(1, 2))
        s_BHK = s_BHK.float().mul_(attn.scale).masked_fill_(~valid_BK[:, None], float("-inf"))
        o_lat_BHC = torch.bmm(s_BHK.softmax(-1).to(c_BKC.dtype), c_BKC)
        return torch.einsum("bhc,hvc->bhv", o_lat_BHC, w_uv)
