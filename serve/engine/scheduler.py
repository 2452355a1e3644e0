"""Continuous batching: which sequences run in the next step, and how many tokens of each.

Every step is one forward pass over a set of (sequence, chunk) pairs. A chunk is the next tokens of a
sequence that have no KV entries yet: one token for a decoding sequence, up to the rest of the prompt
for a prefilling one. The step's chunks together stay under `max_num_batched_tokens` (chunked prefill),
and at most `max_num_seqs` sequences hold blocks at a time. Running sequences are served first, in
arrival order, then waiting ones are admitted while blocks and budget last (requests join a running
batch between steps). When a running sequence needs a block and none is free, the most recently
arrived running sequence is preempted: its blocks are freed and it goes back to the front of the
waiting queue, to be recomputed from its tokens (prompt + output so far) when it is readmitted.

Plain Python; it does not know about tensors, the model, or text (stop strings are the engine's).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from serve.engine.block_manager import BlockManager
from serve.engine.sequence import Sequence, SequenceStatus, TokenLogprob


@dataclass(frozen=True)
class ScheduledChunk:
    """`num_tokens` tokens of `seq` starting at `seq.num_computed_tokens`; `sample` when the chunk ends the
    sequence's known tokens, so its last position's logits give the next token."""

    seq: Sequence
    num_tokens: int
    sample: bool
    # Speculative decoding: how many of `seq.spec.draft_token_ids` ride along after the chunk to be verified.
    num_draft: int = 0


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 2048,
        eos_token_ids: tuple[int, ...] = (),
        max_model_len: int | None = None,
        num_lookahead_slots: int = 0,
    ):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        # Speculative decoding: slots a sampling chunk's sequence needs past its tokens (the drafts the next
        # step verifies, and the MTP layer's cache entries while drafting them).
        self.num_lookahead_slots = num_lookahead_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # ---- requests --------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        bm = self.block_manager
        if seq.num_blocks_for(seq.num_tokens + 1, bm.block_size) > bm.num_blocks:
            raise ValueError(
                f"request {seq.request_id!r}: {seq.num_tokens} prompt tokens do not fit in a KV cache of "
                f"{bm.num_blocks} blocks x {bm.block_size} tokens"
            )
        if self.max_model_len is not None and seq.num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {seq.request_id!r}: prompt of {seq.num_tokens} tokens reaches max_model_len "
                f"{self.max_model_len}"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Stop a request now and free its blocks. Returns it, or None if it is not here (finished)."""
        for seq in list(self.waiting) + self.running:
            if seq.request_id == request_id:
                self.finish(seq, "abort")
                return seq
        return None

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ---------------------------------------------------------------------------------

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        preempted_before = self.num_preemptions
        chunks: list[ScheduledChunk] = []
        bm = self.block_manager

        # Running sequences first, oldest first; the newest are the ones preempted when blocks run out.
        self.running.sort(key=lambda s: s.arrival)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            if seq.num_blocks_for(seq.num_computed_tokens + n, bm.block_size) > bm.num_blocks:
                self.finish(seq, "length")  # longer than the whole cache: it can never run again
                continue
            sample = seq.num_computed_tokens + n == seq.num_tokens
            d = self._num_draft(seq, n, budget) if sample else 0
            while not bm.grow(seq, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # it preempted itself: nothing after it is running any more
            chunks.append(ScheduledChunk(seq, n, sample=sample, num_draft=d))
            budget -= n + d
            i += 1

        # Then admit waiting sequences, first come first served, while there is room (not in a step that
        # just preempted: the cache is full, and a readmitted sequence would only be preempted again).
        while (
            self.waiting
            and budget > 0
            and len(self.running) < self.max_num_seqs
            and self.num_preemptions == preempted_before
        ):
            seq = self.waiting[0]
            if not bm.can_allocate(seq):
                break
            self.waiting.popleft()
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            sample = seq.num_computed_tokens + n == seq.num_tokens
            if sample and self.num_lookahead_slots:  # room for the drafts it will make (best effort)
                bm.grow(seq, seq.num_tokens + self.num_lookahead_slots)
            chunks.append(ScheduledChunk(seq, n, sample=sample))
            budget -= n
        return chunks

    def _num_draft(self, seq: Sequence, n: int, budget: int) -> int:
        """Drafts verified with this sampling chunk, given the token budget and free blocks. Drafts never
        preempt anything: without room the sequence simply decodes one token this step."""
        if not self.num_lookahead_slots:
            return 0
        d = min(len(seq.spec.draft_token_ids) if seq.spec is not None else 0, budget - n)
        bm = self.block_manager
        if seq.num_blocks_for(seq.num_computed_tokens + n + d, bm.block_size) > bm.num_blocks:
            d = 0
        # Room for the verified slots and for next step's drafting; fall back to the verified slots alone.
        if not bm.grow(seq, seq.num_computed_tokens + n + d + self.num_lookahead_slots):
            if d and not bm.grow(seq, seq.num_computed_tokens + n + d):
                d = 0
        return max(0, d)

    def postprocess(
        self, chunks: list[ScheduledChunk], sampled: list[TokenLogprob | list[TokenLogprob] | None]
    ) -> list[Sequence]:
        """Record a step's results: advance computed counts, register full blocks in the prefix cache,
        append sampled tokens and apply the token-level stop rules (EOS, stop_token_ids, max_tokens,
        max_model_len). Returns the sequences that got new tokens.

        With speculative decoding an entry is a list: the accepted drafts (their KV entries were written by
        the verification, so they count as computed) and then the target's token. A stop rule cuts the list
        at the first token that stops, exactly where one-token-a-step decoding would have stopped."""
        updated = []
        for chunk, out in zip(chunks, sampled, strict=True):
            seq = chunk.seq
            if seq.is_finished:  # aborted while the step ran
                continue
            seq.num_computed_tokens += chunk.num_tokens
            if not chunk.sample:
                self.block_manager.commit(seq)
                continue
            if out is None:
                raise RuntimeError(f"{seq.request_id}: the step sampled no token for a sampling chunk")
            tokens = out if isinstance(out, list) else [out]
            stop: tuple[str, int | None] | None = None
            for j, tok in enumerate(tokens):
                if j:
                    seq.num_computed_tokens += 1  # an accepted draft, verified in this step's forward
                seq.append_token(tok.token_id, tok)
                stop = self._stop_rule(seq, tok.token_id)
                if stop is not None:
                    break
            self.block_manager.commit(seq)
            updated.append(seq)
            if stop is not None:
                self.finish(seq, *stop)
        return updated

    def _stop_rule(self, seq: Sequence, token_id: int) -> tuple[str, int | None] | None:
        p = seq.params
        if not p.ignore_eos and token_id in self.eos_token_ids:
            return "stop", token_id
        if token_id in p.stop_token_ids:
            return "stop", token_id
        if seq.num_output_tokens >= p.max_tokens:
            return "length", None
        if self.max_model_len is not None and seq.num_tokens >= self.max_model_len:
            return "length", None
        return None
