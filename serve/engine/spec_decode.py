"""MTP speculative decoding in the engine: the MTP layer drafts k tokens, the main model verifies them at once.

GLM-5 ships one MTP layer (`model.layers.{num_hidden_layers}`) trained to be chained (reference §5). Per step,
for each sequence that samples:

  verify   the main model runs [x_e0, d_1..d_k] (the last sampled token and the drafts from the previous
           step) in the same flattened forward as every other chunk; rows e0..e0+k give p_1..p_{k+1};
           serve/engine/rejection_sampler.py accepts a prefix of the drafts and adds one token.
  extend   the MTP layer writes its cache entries for this step's positions from the *main* hidden states:
           the entry at position p is MTPLayer(h_{p-1}, x_p), p = chunk start .. e (e = the newest token).
           This also overwrites whatever the drafting of the previous step wrote there (the rollback of the
           MTP cache: rejected and accepted draft entries alike are replaced by the real ones).
  draft    the output at position e gives d_1; steps j = 1..k-1 feed the MTP output hidden and d_j back into
           the same layer at position e+j (GLM-5's chaining), each a batched one-token decode over the MTP cache.

The MTP layer's cache (latent, rotary key, index key) is one more layer of the engine's paged KVCache
(layer index num_hidden_layers), addressed through each sequence's own block table: slot of position p is
the same for the main layers and the MTP layer, so prefix caching, preemption and freeing need nothing new.
Position 0 has no MTP entry (no hidden precedes it); MTP context index i holds position i + 1.

Rollback of the main cache: the verification wrote entries for all k+1 rows; only accepted positions are
counted as computed (`num_computed_tokens`), so the rejected slots are simply overwritten when those positions
are computed for real, and the prefix cache registers only blocks below `num_computed_tokens`.

The main hidden h_{start-1} that the first MTP entry of a chunk needs comes from the previous step (carried
in SpecState). After a prefix-cache hit the sequence never computed it; that one entry is then made from a
zero hidden (as vLLM zeroes the embedding at position 0). That only changes draft quality, never the output.

Cost: the verification rows and a short MTP extend run as single-token attention units through the batched
absorbed decode path (each over its own causal context), so a k+1-token verification costs about one decode
step plus the extra routed experts its tokens pick; drafting costs one MTP-layer pass and one lm_head per
draft. benchmarks/bench_mtp.py measures each part.

Scheduling: the scheduler gives a decoding sequence's drafts slots in its chunk (`ScheduledChunk.num_draft`)
and `num_draft_tokens` lookahead slots for the drafting that follows; drafts never preempt anything (without
room a sequence decodes one token). Requests with penalties are not speculated (their distribution depends
on the tokens before each position; see rejection_sampler.py).

Draft vocabulary (`EngineConfig.draft_vocab`, FR-Spec): a draft multiplies the MTP output by the whole
lm_head, V x D; at GLM-5's 154,880 x 6144 that is most of the bytes a draft reads. Drafting from the tokens a
model actually emits (finetune/mtp_align.py `draft_vocab` counts them in its own generations) reads a fraction
of it. Only drafts change: verification uses the full vocabulary, so outputs are identical, and a token
outside the set is just never proposed.

Shapes: N tokens in a step, B sequences, D hidden, V vocab, K drafts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from serve.engine.config import EngineConfig
from serve.engine.fast_layer import rms_norm
from serve.engine.fused_weights import FusedLayer, fuse_layer
from serve.engine.kv_cache import KVCache
from serve.engine.model_runner import ModelRunner
from serve.engine.rejection_sampler import draft_tokens, verify
from serve.engine.scheduler import ScheduledChunk
from serve.engine.sequence import Sequence, TokenLogprob
from serve.engine.step_input import SeqInput, StepInput


def write_draft_vocab(path, token_ids, **info) -> None:
    """Save a draft vocabulary (EngineConfig.draft_vocab) as JSON: {"draft_vocab": [...], **info}."""
    Path(path).write_text(json.dumps({"draft_vocab": sorted(int(t) for t in token_ids), **info}) + "\n")


def read_draft_vocab(path) -> tuple[int, ...]:
    """A draft vocabulary file (write_draft_vocab's JSON, or a bare JSON list of token ids) -> token ids.
    Raises ValueError naming the file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read the draft vocabulary {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    ids = data.get("draft_vocab") if isinstance(data, dict) else data
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f'{path}: expected a list of token ids, or {{"draft_vocab": [token ids]}}')
    return tuple(ids)


@dataclass
class MTPSeqInput(SeqInput):
    """A chunk of the MTP layer: its context index i is position i + 1 (position 0 has no MTP entry), kept in
    that position's slot, so an MTP entry shares its block (and prefix-cache hash) with the main entries of
    the same position. `start`, `n`, `q_idx` count in context indices. Its context is a view of the cache
    when the blocks are consecutive, as for the main layers (it used to be copied: 37 MB per MTP pass at 32K)."""

    pos_offset = 1


@dataclass
class SpecState:
    """A sequence's speculative state between steps (lives on `Sequence.spec`)."""

    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs_KV: torch.Tensor | None = None  # q of each draft (None for greedy requests)
    hidden_D: torch.Tensor | None = None  # main hidden (after model.norm) at position hidden_pos
    hidden_pos: int = -1
    # The newest position whose MTP entry an extend wrote (from the main hidden, not a draft's), and the
    # sequence's preemption count then: a preemption frees the blocks, and the entry with them.
    extended_pos: int = -1
    extended_epoch: int = 0


@dataclass
class SpecMetrics:
    """Counters over the engine's life. Acceptance length = tokens emitted per verifying sequence-step."""

    num_draft_tokens_per_step: int
    num_verifications: int = 0  # sequence-steps that verified at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_at: list[int] = field(default_factory=list)  # [j]: how often draft j+1 was accepted
    # Wall time of the parts of a step (benchmarks compare them): the main forward incl. verification rows;
    # acceptance; the MTP extend over the step's positions; drafting (an lm_head per draft, and the chained
    # MTP passes after the first).
    forward_s: float = 0.0
    accept_s: float = 0.0
    extend_s: float = 0.0
    chain_s: float = 0.0
    num_chain_steps: int = 0
    num_extend_rows: int = 0  # MTP extend rows (one per position whose MTP entry the extend writes)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification (accepted drafts + the one the target adds): 1.0 means no gain."""
        return 1.0 + self.num_accepted_tokens / self.num_verifications if self.num_verifications else 0.0


class SpecModelRunner(ModelRunner):
    """ModelRunner that verifies each sequence's drafts in the step's forward and proposes the next ones."""

    def __init__(self, model, engine_cfg: EngineConfig, device: torch.device | str = "cpu"):
        cfg = model.config
        if cfg.num_nextn_predict_layers < 1:
            raise ValueError(
                "speculative='mtp' needs the checkpoint's MTP layer, and this model has none (num_nextn_predict_layers"
                " 0; transformers' save_pretrained writes none): serve it without speculative decoding"
            )
        if engine_cfg.num_kv_blocks is None:  # size the cache from kv_cache_gib with the MTP layer counted in
            dtype = next(model.parameters()).dtype
            per_token = (
                KVCache.bytes_per_token(cfg, dtype)
                + (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim)
                * torch.empty((), dtype=dtype).element_size()
            )
            blocks = max(1, int(engine_cfg.kv_cache_gib * 2**30) // (per_token * engine_cfg.block_size))
            engine_cfg = replace(engine_cfg, num_kv_blocks=blocks)
        super().__init__(model, engine_cfg, device)
        cfg = self.cfg
        self.k = engine_cfg.num_draft_tokens
        self.mtp_layer = cfg.num_hidden_layers
        self.max_model_len: int | None = None  # set by the engine; drafts never run past it
        kv = self.kv
        kw = dict(dtype=kv.dtype, device=self.device)
        kv.latent_NPK.append(torch.zeros(kv.num_blocks, kv.block_size, kv.C + kv.R, **kw))
        kv.index_k_NPD.append(torch.zeros(kv.num_blocks, kv.block_size, cfg.index_head_dim, **kw))
        self.mtp_fused: FusedLayer | None = None
        self.draft_ids: torch.Tensor | None = None  # EngineConfig.draft_vocab, and its lm_head rows:
        self._draft_head: tuple[torch.Tensor, tuple] | None = None  # (input-major [D, n] copy, source key)
        if engine_cfg.draft_vocab is not None:
            if type(model.lm_head) is not torch.nn.Linear:
                raise ValueError(f"draft_vocab needs a plain nn.Linear lm_head, not {type(model.lm_head).__name__}")
            bad = [t for t in engine_cfg.draft_vocab if t >= cfg.vocab_size]
            if bad:
                raise ValueError(f"draft_vocab has token ids beyond the vocabulary ({cfg.vocab_size}): {bad[:5]}")
            self.draft_ids = torch.tensor(sorted(engine_cfg.draft_vocab), dtype=torch.long, device=self.device)
        self.spec_metrics = SpecMetrics(self.k, accepted_at=[0] * self.k)

    # ---- step preparation: the chunk's tokens plus its drafts ----------------------------------------

    def _units(self, cls, offset: int, start: int, n: int, bt: torch.Tensor) -> list[SeqInput]:
        """Attention units of a chunk. A short chunk (a verification: last token + drafts, or the MTP extend
        after one) whose context still fits in the DSA budget becomes one single-token unit per row, each over
        its own causal context: they go through the batched absorbed decode path instead of expanding keys
        and values over the whole context as a dense prefill does. Past the budget a chunk already attends
        absorbed over its top-k, and one unit shares one indexer call among its rows. A row's context includes
        the rows before it: every row's cache entries are written before attention runs."""
        if 1 < n <= self.k + 1 and start + n <= self.cfg.index_topk:
            return [cls(offset + j, start + j, 1, bt, self.block_size) for j in range(n)]
        return [cls(offset, start, n, bt, self.block_size)]

    def prepare_spec(self, chunks: list[ScheduledChunk]) -> tuple[StepInput, list[SeqInput]]:
        """The step's input (each chunk's tokens followed by its drafts) and each chunk's span in it."""
        ids, pos, slots, units, spans, sample_rows = [], [], [], [], [], []
        offset = 0
        for c in chunks:
            s, start, d = c.seq, c.seq.num_computed_tokens, c.num_draft
            n = c.num_tokens + d
            bt = torch.tensor(s.block_table, dtype=torch.long, device=self.device)
            span = SeqInput(offset, start, n, bt, self.block_size)
            ids.extend(s.token_ids[start : start + c.num_tokens] + s.spec.draft_token_ids[:d])
            pos.append(span.q_idx)
            slots.append(span.slots(span.q_idx))
            spans.append(span)
            units.extend(self._units(SeqInput, offset, start, n, bt) if d else [span])
            if c.sample:
                sample_rows.extend(range(offset + c.num_tokens - 1, offset + n))  # the d + 1 verification rows
            offset += n
        ids_N = torch.tensor(ids, dtype=torch.long, device=self.device)
        return StepInput(ids_N, torch.cat(pos), torch.cat(slots), units, sample_rows), spans

    def _layer(self, i: int, layer, fused, x_ND, cos, sin, rope_cs, step: StepInput, prev_topk):
        if self.fast:
            return self._layer_fast(i, layer, fused, x_ND, rope_cs, step, prev_topk)
        return self._layer_plain(i, layer, x_ND, cos, sin, step, prev_topk)

    def _trunk(self, step: StepInput) -> torch.Tensor:
        """The main layers over the step (the base runner's path) -> hidden after model.norm, every row [N, D]."""
        m = self.model.model
        if self.fast:
            self._ensure_fused()
        x_ND = m.embed_tokens(step.input_ids_N)
        cos, sin, rope_cs = self._rope(step.positions_N)
        prev_topk: dict[int, torch.Tensor | None] = {}
        for i, layer in enumerate(self._layers()):
            fused = self.fused[i] if self.fast else None
            x_ND = self._layer(i, layer, fused, x_ND, cos, sin, rope_cs, step, prev_topk)
        return m.norm(x_ND)

    def _mtp(self, step: StepInput, hidden_ND: torch.Tensor) -> torch.Tensor:
        """The MTP layer over `step` (its cache entries are written) -> output after shared_head.norm [N, D]."""
        m = self.model.model
        layer = m.layers[self.mtp_layer]
        if self.fast and (self.mtp_fused is None or not self.mtp_fused.is_current()):
            self.mtp_fused = fuse_layer(layer)
        norm = self._norm
        e = norm(layer.enorm, m.embed_tokens(step.input_ids_N))
        z = layer.eh_proj(torch.cat([e, norm(layer.hnorm, hidden_ND)], dim=-1))  # order: [embedding, hidden]
        cos, sin, rope_cs = self._rope(step.positions_N)
        z = self._layer(self.mtp_layer, layer, self.mtp_fused, z, cos, sin, rope_cs, step, {})
        return norm(layer.shared_head.norm, z)

    def _norm(self, norm, x: torch.Tensor) -> torch.Tensor:
        """An RMSNorm module: `rms_norm` on the fast path (as `_layer_fast` does), the module on the plain."""
        return rms_norm(norm, x) if self.fast else norm(x)

    # ---- the step ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> list[TokenLogprob | list[TokenLogprob] | None]:
        """Forward + verify; one entry per chunk: None (no sampling), a token, or the tokens a verification
        emitted (accepted drafts, then the target's own token)."""
        if not chunks:
            return []
        for c in chunks:
            if c.seq.spec is None:
                c.seq.spec = SpecState()
        met = self.spec_metrics
        t0 = time.perf_counter()
        step, spans = self.prepare_spec(chunks)
        hidden_ND = self._trunk(step)
        logits_RV = self.model.lm_head(hidden_ND[step.sample_rows]).float() if step.sample_rows else None
        t1 = time.perf_counter()

        results: list[TokenLogprob | list[TokenLogprob] | None] = [None] * len(chunks)
        plain, row = [], 0  # chunks without drafts go through the ordinary sampler, batched
        for i, c in enumerate(chunks):
            if not c.sample:
                continue
            if c.num_draft == 0:
                plain.append((i, row))
            else:
                st, d = c.seq.spec, c.num_draft
                probs = st.draft_probs_KV[:d] if st.draft_probs_KV is not None else None
                out = verify(logits_RV[row : row + d + 1], st.draft_token_ids[:d], probs, c.seq.params, c.seq.generator)
                results[i] = out
                met.num_verifications += 1
                met.num_draft_tokens += d
                met.num_accepted_tokens += len(out) - 1
                for j in range(len(out) - 1):
                    met.accepted_at[j] += 1
            row += c.num_draft + 1
        if plain:
            sampled = self.sampler(logits_RV[[r for _, r in plain]], [chunks[i].seq for i, _ in plain])
            for (i, _), tok in zip(plain, sampled, strict=True):
                results[i] = tok
        t2 = time.perf_counter()
        self._propose(chunks, spans, hidden_ND, results)
        met.forward_s += t1 - t0
        met.accept_s += t2 - t1
        return results

    # ---- the proposer -----------------------------------------------------------------------------

    def _num_drafts(self, seq: Sequence, e: int, emitted: int) -> int:
        """Drafts worth making for a sequence whose newest token is at position e."""
        p = seq.params
        if p.has_penalties:
            return 0  # penalties depend on the tokens before each position: verify would need them per row
        if p.constraint is not None:
            return 0  # a grammar's mask depends on the tokens before each position too (the sampler applies it)
        left = p.max_tokens - (seq.num_output_tokens + emitted)  # tokens the request may still emit
        k = min(self.k, left - 1, len(seq.block_table) * self.block_size - e)
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - e - 2)
        return max(0, k)

    def _propose(self, chunks, spans: list[SeqInput], hidden_ND: torch.Tensor, results) -> None:
        """MTP extend over this step's positions from the main hidden states, then chain the drafts."""
        t0 = time.perf_counter()
        D = hidden_ND.shape[-1]
        ids, pos, slots, hid, seqs = [], [], [], [], []
        # (seq, its block table, extend row of position e, drafts wanted, e)
        drafting: list[tuple[Sequence, torch.Tensor, int, int, int]] = []
        offset = 0
        for c, si, out in zip(chunks, spans, results, strict=True):
            s, st, start = c.seq, c.seq.spec, si.start
            emitted = [] if out is None else (out if isinstance(out, list) else [out])
            # e: the newest position whose token is known (the sampled one, or the chunk's last prompt token).
            e = start + c.num_tokens - 1 + len(emitted)
            # Carry the main hidden the next chunk's first MTP entry needs (the next chunk starts at e if this
            # one sampled, else at e + 1).
            nxt = e if emitted else e + 1
            carry_row = si.offset + (nxt - 1 - start)
            prev_hidden = st.hidden_D if st.hidden_pos == start - 1 else None
            st.hidden_D, st.hidden_pos = hidden_ND[carry_row].clone(), nxt - 1
            st.draft_token_ids, st.draft_probs_KV = [], None

            e_w = min(e, len(s.block_table) * self.block_size - 1)  # no slot past the block table
            p0 = max(start, 1)  # position 0 has no MTP entry
            if st.extended_pos == start and st.extended_epoch == s.num_preemptions and prev_hidden is not None:
                # The previous step's extend already wrote `start` from the same token and main hidden (its
                # drafts wrote only the positions after it): one row less per step.
                p0 = start + 1
            if e_w < p0:
                continue
            st.extended_pos, st.extended_epoch = e_w, s.num_preemptions
            rows = hidden_ND[si.offset + (p0 - 1 - start) + (1 if p0 == start else 0) : si.offset + (e_w - start)]
            if p0 == start:  # h_{start-1} is from the previous step (or zeros after a prefix-cache hit)
                first = prev_hidden if prev_hidden is not None else hidden_ND.new_zeros(D)
                rows = torch.cat([first[None], rows])
            n = e_w - p0 + 1
            mseq = MTPSeqInput(offset, p0 - 1, n, si.block_table, self.block_size)  # positions p0..e_w
            # Tokens at positions p0..e_w: the sequence's own from p0 on, then what this step emitted (not appended
            # yet). Sliced from p0, not copied whole: a decode step must not cost O(context) in Python.
            ids.extend((s.token_ids[p0:] + [t.token_id for t in emitted])[: e_w + 1 - p0])
            pos.append(mseq.q_idx + 1)
            slots.append(mseq.slots(mseq.q_idx))
            hid.append(rows)
            seqs.extend(self._units(MTPSeqInput, offset, p0 - 1, n, si.block_table))
            offset += n
            if emitted and e_w == e:
                k = self._num_drafts(s, e, len(emitted))
                if k:
                    drafting.append((s, si.block_table, offset - 1, k, e))
        if not seqs:
            return
        mstep = StepInput(
            torch.tensor(ids, dtype=torch.long, device=self.device), torch.cat(pos), torch.cat(slots), seqs, []
        )
        z_ND = self._mtp(mstep, torch.cat(hid))
        self.spec_metrics.num_extend_rows += len(ids)
        self.spec_metrics.extend_s += time.perf_counter() - t0
        if drafting:
            self._draft(drafting, z_ND[[d[2] for d in drafting]])  # the MTP output at each e gives d_1

    def _draft_logits(self, z_BD: torch.Tensor) -> torch.Tensor:
        """Draft logits [B, V] (fp32). With a draft vocabulary only its rows of the lm_head are read (a copy,
        input-major, remade when the lm_head's weight changes) and every other token gets -inf, so sampling,
        its q, and the rejection rule work on a distribution that is simply zero outside the set."""
        if self.draft_ids is None:
            return self.model.lm_head(z_BD).float()
        sub_Bn = self._draft_sub_logits(z_BD)
        logits_BV = sub_Bn.new_full((sub_Bn.shape[0], self.cfg.vocab_size), float("-inf"))
        return logits_BV.index_copy_(1, self.draft_ids, sub_Bn)

    def _draft_sub_logits(self, z_BD: torch.Tensor) -> torch.Tensor:
        """Logits of the draft vocabulary's tokens only, [B, n] fp32 (column i is token draft_ids[i])."""
        w = self.model.lm_head.weight
        key = (w.data_ptr(), w._version, w.dtype)
        if self._draft_head is None or self._draft_head[1] != key:
            with torch.inference_mode(False), torch.no_grad():
                self._draft_head = (w.detach().index_select(0, self.draft_ids).T.contiguous(), key)
        return (z_BD.to(w.dtype) @ self._draft_head[0]).float()

    def _draft(self, drafting: list[tuple[Sequence, torch.Tensor, int, int, int]], z_BD: torch.Tensor) -> None:
        """d_1 from the extend's output at e; then d_{j+1} from the layer run again on (its output, d_j) at
        position e + j, for the sequences that want more than j drafts."""
        t0 = time.perf_counter()
        seqs_all = [d[0] for d in drafting]
        qs_all: list[list[torch.Tensor | None]] = [[] for _ in drafting]
        live = list(range(len(drafting)))
        for j in range(self.k):
            if j > 0:
                live_next = [b for b in live if drafting[b][3] > j]
                if len(live_next) < len(live):
                    z_BD = z_BD[[live.index(b) for b in live_next]]
                live = live_next
                if not live:
                    break
                # One-token MTP inputs at position p = e + j (context index p - 1); ids, positions and slots
                # made from Python ints, three tensors per pass (a batch-1 draft pays per torch call).
                ids, pos, slots, seqs = [], [], [], []
                bs = self.block_size
                for i, b in enumerate(live):
                    s, p = seqs_all[b], drafting[b][4] + j
                    ids.append(s.spec.draft_token_ids[-1])
                    pos.append(p)
                    slots.append(s.block_table[p // bs] * bs + p % bs)
                    seqs.append(MTPSeqInput(i, p - 1, 1, drafting[b][1], bs))
                as_long = dict(dtype=torch.long, device=self.device)
                step = StepInput(
                    torch.tensor(ids, **as_long), torch.tensor(pos, **as_long), torch.tensor(slots, **as_long), seqs, []
                )
                z_BD = self._mtp(step, z_BD)  # fed back: the output after shared_head.norm (mtp_forward's rule)
                self.spec_metrics.num_chain_steps += 1
            seqs_b = [seqs_all[b] for b in live]
            if self.draft_ids is not None and all(s.params.greedy for s in seqs_b):
                # Greedy from a draft vocabulary: the argmax of its own logits, mapped back to token ids.
                toks = self.draft_ids[self._draft_sub_logits(z_BD).argmax(-1)].tolist()
                qs = [None] * len(toks)
            else:
                logits_BV = self._draft_logits(z_BD)
                toks, qs = draft_tokens(logits_BV, [s.params for s in seqs_b], [s.generator for s in seqs_b])
            for b, s, t, q in zip(live, seqs_b, toks, qs, strict=True):
                s.spec.draft_token_ids.append(t)
                qs_all[b].append(q)
        for s, qs in zip(seqs_all, qs_all, strict=True):
            if qs and qs[0] is not None:
                s.spec.draft_probs_KV = torch.stack(qs)
        self.spec_metrics.chain_s += time.perf_counter() - t0
