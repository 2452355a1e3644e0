"""Paged KV-cache blocks: allocation, reference counts and prefix caching. Plain Python, no tensors.

The KV cache is cut into fixed-size blocks of `block_size` token slots; a sequence's block table lists
the blocks that hold its tokens in order. Prefix caching: once a block is *full and computed*, it is
registered under a hash chained over all tokens up to and including it (hash of the previous block's
hash and this block's tokens), so a later request whose prompt starts with the same tokens (the same
system prompt and tools, or the previous agent turn) maps those blocks into its own table and skips
their prefill. A block is shared by reference count; when the count drops to zero the block goes to
the back of the free list but keeps its contents and hash, so it can still be revived by a hit until
it is reused for something else: the free list is therefore an LRU of cached blocks.

Blocks are registered only after their KV entries were written (not at allocation), because with chunked
prefill a block may be allocated steps before it is computed, and a hit on it must not read garbage.
"""

from __future__ import annotations

from collections import OrderedDict

from serve.engine.sequence import Sequence


def chain_hash(prev_hash: int | None, token_ids: list[int]) -> int:
    """The prefix hash of a full block. Collisions are caught by comparing the stored token ids."""
    return hash((prev_hash, tuple(token_ids)))


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


class BlockManager:
    """Hands out block ids for sequences; the model runner owns the tensors they index."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in LRU order (oldest first); the value is unused. OrderedDict gives O(1) removal on a hit.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        # Prefix-cache statistics, in prompt tokens.
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    # ---- queries -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences (free cached blocks count as free)."""
        return 1.0 - len(self.free) / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Fresh blocks `seq` needs so that its table covers `num_tokens` token slots."""
        return max(0, seq.num_blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    # ---- allocation ----------------------------------------------------------------------------

    def _new_block(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        # Reusing a cached block for new content: forget its old identity.
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        block.hash = None
        block.token_ids = ()
        block.ref_count = 1
        return block_id

    def _match_prefix(self, seq: Sequence) -> tuple[list[int], int | None]:
        """Block ids of the longest cached prefix of `seq` and the hash of its last block, leaving at
        least one token to compute (the last token must run through the model to give the logits of
        the next one)."""
        matched: list[int] = []
        h = last = None
        if not self.enable_prefix_caching:
            return matched, last
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = seq.block_tokens(i, self.block_size)
            h = chain_hash(h, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tuple(tokens):
                break
            matched.append(block_id)
            last = h
        return matched, last

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether `seq` (not yet holding blocks) fits: its whole token list, minus the cached prefix."""
        matched, _ = self._match_prefix(seq)
        revived = sum(1 for b in matched if self.blocks[b].ref_count == 0)
        fresh = seq.num_blocks_for(seq.num_tokens, self.block_size) - len(matched)
        return fresh + revived <= len(self.free)

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing cached prefix blocks.

        Sets `num_computed_tokens` to the length of the reused prefix. Raises if it does not fit
        (the scheduler asks `can_allocate` first)."""
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id}: allocate() on a sequence that already holds blocks")
        if not self.can_allocate(seq):
            raise RuntimeError(f"{seq.request_id}: not enough free KV blocks")
        matched, last_hash = self._match_prefix(seq)
        for block_id in matched:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        seq.block_table = list(matched)
        seq.num_committed_blocks, seq.last_block_hash = len(matched), last_hash
        seq.num_computed_tokens = seq.num_cached_tokens = len(matched) * self.block_size
        self.num_queried_tokens += seq.num_tokens
        self.num_hit_tokens += seq.num_cached_tokens
        self.grow(seq, seq.num_tokens)

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Extend the block table of a running sequence to cover `num_tokens` slots. False if no room."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free):
            return False
        for _ in range(need):
            seq.block_table.append(self._new_block())
        return True

    def free_seq(self, seq: Sequence) -> None:
        """Drop the sequence's references. Its last blocks go on the free list first, so the LRU
        evicts the tail of a conversation before the shared head (system prompt, tools)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is None:
                    block.token_ids = ()
                self.free[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_committed_blocks, seq.last_block_hash = 0, None

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's newly full, computed blocks in the prefix cache (after each step)."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        h = seq.last_block_hash
        for i in range(seq.num_committed_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            tokens = seq.block_tokens(i, self.block_size)
            h = chain_hash(h, tokens)
            block.hash = h
            block.token_ids = tuple(tokens)
            # If an identical block exists already (two equal prompts computed side by side), keep the first.
            self.hash_to_block.setdefault(h, block.block_id)
        seq.num_committed_blocks, seq.last_block_hash = max(num_full, seq.num_committed_blocks), h

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (new weights make them stale). Blocks in use stay allocated but are
        no longer found by hits; their sequences re-register nothing already committed."""
        self.hash_to_block.clear()
        for block in self.blocks:
            block.hash = None
            block.token_ids = ()
