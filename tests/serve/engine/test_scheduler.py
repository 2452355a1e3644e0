"""Scheduler without a model: continuous batching, chunked prefill, preemption, limits, abort."""

from __future__ import annotations

import pytest

from serve.engine.block_manager import BlockManager
from serve.engine.sampling_params import SamplingParams
from serve.engine.scheduler import Scheduler
from serve.engine.sequence import Sequence, SequenceStatus, TokenLogprob

EOS = 0


def make(num_blocks=64, block_size=4, **kw):
    return Scheduler(BlockManager(num_blocks, block_size), eos_token_ids=(EOS,), **kw)


def seq(n, rid, max_tokens=8, arrival=0, start=None, **kw):
    """A sequence of n distinct tokens; sequences share a prefix only when a test passes the same start."""
    start = 1 + 1000 * arrival if start is None else start
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens, **kw), arrival=arrival)


def run_step(sched, token=7):
    """One fake engine step: every sampling chunk yields `token`."""
    chunks = sched.schedule()
    out = [TokenLogprob(token, -0.5) if c.sample else None for c in chunks]
    sched.postprocess(chunks, out)
    return chunks


def test_chunked_prefill_respects_the_token_budget():
    sched = make(max_num_batched_tokens=8)
    a = seq(20, "a")
    sched.add(a)
    sizes = []
    for _ in range(3):
        chunks = run_step(sched)
        sizes.append([(c.seq.request_id, c.num_tokens, c.sample) for c in chunks])
    assert sizes == [[("a", 8, False)], [("a", 8, False)], [("a", 4, True)]]
    assert a.num_output_tokens == 1 and a.num_computed_tokens == 20


def test_requests_join_a_running_batch_between_steps():
    sched = make(max_num_batched_tokens=64)
    a = seq(5, "a", arrival=0)
    sched.add(a)
    run_step(sched)
    b = seq(6, "b", arrival=1)
    sched.add(b)
    chunks = run_step(sched)
    assert [(c.seq.request_id, c.num_tokens) for c in chunks] == [("a", 1), ("b", 6)]
    assert all(c.sample for c in chunks)


def test_max_num_seqs_limits_running():
    sched = make(max_num_seqs=2)
    for i in range(3):
        sched.add(seq(3, f"s{i}", arrival=i))
    run_step(sched)
    assert [s.request_id for s in sched.running] == ["s0", "s1"]
    assert [s.request_id for s in sched.waiting] == ["s2"]


def test_eos_max_tokens_and_stop_token_ids_finish_and_free():
    sched = make()
    a = seq(3, "a", max_tokens=2)
    b = seq(3, "b", max_tokens=5, stop_token_ids=[9], arrival=1)
    c = seq(3, "c", max_tokens=5, arrival=2)
    d = seq(3, "d", max_tokens=1, ignore_eos=True, arrival=3)
    for s in (a, b, c, d):
        sched.add(s)
    chunks = sched.schedule()
    toks = {"a": 7, "b": 9, "c": EOS, "d": EOS}
    sched.postprocess(chunks, [TokenLogprob(toks[ch.seq.request_id], 0.0) for ch in chunks])
    assert (b.finish_reason, b.stop_reason) == ("stop", 9)
    assert (c.finish_reason, c.stop_reason) == ("stop", EOS)
    assert d.finish_reason == "length" and d.output_token_ids == [EOS]
    assert not a.is_finished
    run_step(sched)
    assert a.finish_reason == "length" and a.num_output_tokens == 2
    assert not sched.has_unfinished and sched.block_manager.num_free_blocks == 64


def test_preemption_by_recompute_when_blocks_run_out():
    # 4 blocks of 4 slots: two sequences of 7 tokens take 2 blocks each; the 9th token of either needs a 5th.
    sched = make(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a = seq(7, "a", max_tokens=10, arrival=0)
    b = seq(7, "b", max_tokens=10, arrival=1)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # prefill both; each now has 8 tokens, 7 computed
    run_step(sched)  # decode: token 8 fits in block 2 of each
    assert sched.num_preemptions == 0
    chunks = run_step(sched)  # a needs a 3rd block: b (the newest) is preempted and recomputed later
    assert [c.seq.request_id for c in chunks] == ["a"]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert sched.num_preemptions == 1 and b.num_output_tokens == 2
    # b comes back with its prompt and outputs recomputed in one chunk once a finishes.
    while not a.is_finished:
        run_step(sched)
    chunks = run_step(sched)
    assert [(c.seq.request_id, c.num_tokens, c.sample) for c in chunks] == [("b", 9, True)]
    assert b.num_output_tokens == 3


def test_a_sequence_longer_than_the_cache_finishes_with_length():
    sched = make(num_blocks=2, block_size=4)
    a = seq(6, "a", max_tokens=50)
    sched.add(a)
    for _ in range(10):
        run_step(sched)
        if a.is_finished:
            break
    assert a.finish_reason == "length" and a.num_tokens == 9  # the 9th needs no slot until it runs


def test_prompt_too_long_for_the_cache_is_rejected():
    sched = make(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="do not fit"):
        sched.add(seq(8, "a"))


def test_abort_frees_blocks_at_once():
    sched = make()
    a = seq(10, "a")
    w = seq(3, "w", arrival=1)
    sched.add(a)
    run_step(sched)
    sched.add(w)
    assert sched.abort("a") is a and a.finish_reason == "abort"
    assert sched.abort("w") is w and w.finish_reason == "abort"
    assert sched.abort("nope") is None
    assert sched.block_manager.num_free_blocks == 64 and not sched.has_unfinished


def test_shared_prefix_skips_prefill_in_the_scheduler():
    sched = make(max_num_batched_tokens=64)
    a = seq(12, "a", start=1)
    sched.add(a)
    run_step(sched)
    b = seq(12, "b", arrival=1, start=1)
    b.token_ids[-1] = 99
    b_prompt_len = b.num_tokens
    sched.add(b)
    chunks = run_step(sched)
    assert [(c.seq.request_id, c.num_tokens) for c in chunks] == [("a", 1), ("b", b_prompt_len - 8)]
