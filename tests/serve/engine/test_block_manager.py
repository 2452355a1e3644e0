"""BlockManager without a model: allocation, reference counts, prefix caching, LRU eviction."""

from __future__ import annotations

import pytest

from serve.engine.block_manager import BlockManager
from serve.engine.sampling_params import SamplingParams
from serve.engine.sequence import Sequence


def seq(tokens, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=4))


def computed(bm, s):
    """Pretend the runner computed every token of `s` and the engine committed the step."""
    s.num_computed_tokens = s.num_tokens
    bm.commit(s)


def test_allocate_covers_all_tokens_and_free_returns_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq(range(10))
    bm.allocate(s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert bm.num_free_blocks == 5 and s.num_computed_tokens == 0
    bm.free_seq(s)
    assert bm.num_free_blocks == 8 and s.block_table == []


def test_grow_adds_a_block_only_at_a_boundary():
    bm = BlockManager(num_blocks=4, block_size=4)
    s = seq(range(4))
    bm.allocate(s)
    assert bm.grow(s, 4) and len(s.block_table) == 1
    assert bm.grow(s, 5) and len(s.block_table) == 2
    assert not bm.grow(s, 17)  # would need 5 blocks in all
    assert len(s.block_table) == 2


def test_prefix_hit_shares_blocks_and_skips_their_prefill():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(10)), "a")
    bm.allocate(a)
    computed(bm, a)
    b = seq(list(range(8)) + [99, 98, 97], "b")
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert bm.prefix_hit_rate == pytest.approx(8 / (10 + 11))


def test_only_computed_blocks_are_hits():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(range(12), "a")
    bm.allocate(a)
    a.num_computed_tokens = 4  # chunked prefill: only the first block is written so far
    bm.commit(a)
    b = seq(range(12), "b")
    bm.allocate(b)
    assert b.num_computed_tokens == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_whole_prompt_cached_still_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(range(8), "a")
    bm.allocate(a)
    computed(bm, a)
    b = seq(range(8), "b")
    bm.allocate(b)
    # 8 tokens = 2 full blocks, but only the first may be reused: the last token must run.
    assert b.num_computed_tokens == 4 and b.block_table[0] == a.block_table[0]
    assert b.block_table[1] != a.block_table[1]


def test_freed_cached_blocks_revive_until_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = seq(range(9), "a")
    bm.allocate(a)
    computed(bm, a)
    a_blocks = list(a.block_table)
    bm.free_seq(a)
    assert bm.num_free_blocks == 4
    b = seq(list(range(8)) + [7, 7], "b")
    assert bm.can_allocate(b)
    bm.allocate(b)
    assert b.block_table[:2] == a_blocks[:2]
    assert b.num_computed_tokens == 8
    bm.free_seq(b)
    # A request with other tokens takes every block: the cached ones are evicted, oldest first.
    c = seq(range(100, 116), "c")
    bm.allocate(c)
    computed(bm, c)
    bm.free_seq(c)
    d = seq(list(range(8)) + [1], "d")
    bm.allocate(d)
    assert d.num_computed_tokens == 0


def test_can_allocate_counts_revived_blocks():
    bm = BlockManager(num_blocks=3, block_size=4)
    a = seq(range(9), "a")
    bm.allocate(a)
    computed(bm, a)
    bm.free_seq(a)
    big = seq(list(range(8)) + list(range(50, 54)) + [1], "big")  # 2 cached + 2 fresh > 3 blocks
    assert not bm.can_allocate(big)
    with pytest.raises(RuntimeError, match="not enough free KV blocks"):
        bm.allocate(big)


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    a = seq(range(12), "a")
    bm.allocate(a)
    computed(bm, a)
    b = seq(range(12), "b")
    bm.allocate(b)
    assert b.num_computed_tokens == 0 and not set(a.block_table) & set(b.block_table)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=0, block_size=4)
