"""MTP speculative decoding in the engine: greedy output identical to no speculation (batches of different
lengths, past index_topk, chunked prefill, preemption, prefix caching, stop rules inside an accepted run),
the engine's drafts equal to the plain model's chained drafts, target logprobs under sampling, the cache and
block accounting after rollbacks, and the `LLM(path, speculative="mtp")` door."""

from __future__ import annotations

import pytest
import torch

from serve import LLM, SamplingParams
from serve.engine.engine import LLMEngine
from serve.engine.rejection_sampler import processed_logprobs
from serve.engine.spec_decode import SpecModelRunner, read_draft_vocab, write_draft_vocab
from tests.model.conftest import close
from tests.serve.engine.conftest import random_prompts
from tests.serve.engine.spec_reference import mtp_drafts, speculative_greedy

# Tiny tensors: one thread beats two fighting over a loaded 2-core box (as tests/model/conftest.py).
torch.set_num_threads(1)

MAX_TOKENS = 14
LENGTHS = [5, 23, 11, 41]  # both sides of index_topk (16) and of block boundaries


def greedy(max_tokens: int = MAX_TOKENS, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=2, **kw)


@pytest.fixture(scope="module")
def prompts(tiny_model):
    return random_prompts(LENGTHS, tiny_model.config.vocab_size, seed=1)


@pytest.fixture(scope="module")
def baseline(tiny_model, prompts):
    llm = LLM(tiny_model, block_size=4, num_kv_blocks=256, max_num_batched_tokens=32)
    return llm.generate(prompts, greedy())


def same_outputs(outs, ref):
    for a, b in zip(outs, ref, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert list(x.top) == list(y.top)


class PlainArgmaxRunner(SpecModelRunner):
    """A drafter whose drafts are the main model's own greedy chain from the real sequence (computed with the
    plain model): under sampling they are likely but not certain tokens, so both acceptance and rejection
    happen. q is one-hot on each draft, so a draft is accepted with probability p(draft)."""

    @torch.inference_mode()
    def run(self, chunks):
        results = super().run(chunks)
        V = self.cfg.vocab_size
        for c, out in zip(chunks, results, strict=True):
            k = len(c.seq.spec.draft_token_ids)
            if out is None or not k:
                continue
            seq = c.seq.token_ids + [t.token_id for t in (out if isinstance(out, list) else [out])]
            drafts = []
            for _ in range(k):
                drafts.append(int(self.model(torch.tensor([seq + drafts]))[0, -1].argmax()))
            c.seq.spec.draft_token_ids = drafts
            c.seq.spec.draft_probs_KV = torch.nn.functional.one_hot(torch.tensor(drafts), V).float()
        return results


class OracleRunner(SpecModelRunner):
    """A drafter that knows the greedy continuation and gets draft `(e % (k+1)) + 1` wrong, so acceptance
    lengths vary per sequence and step (1..k+1). The MTP layer still runs and writes its cache as usual."""

    def __init__(self, model, cfg, continuations: dict[tuple[int, ...], list[int]]):
        super().__init__(model, cfg)
        self.continuations = continuations

    def _draft(self, drafting, z_BD):
        super()._draft(drafting, z_BD)
        V = self.cfg.vocab_size
        for seq, _, _, k, e in drafting:
            full = self.continuations[tuple(seq.prompt_token_ids)]
            drafts = [full[e + j] if e + j < len(full) else 0 for j in range(1, k + 1)]
            wrong = e % (self.k + 1)
            if wrong < k:
                drafts[wrong] = (drafts[wrong] + 1) % V
            seq.spec.draft_token_ids = drafts


def oracle_llm(model, continuations=None, k=3, **kw) -> LLM:
    llm = LLM(model, speculative="mtp", num_draft_tokens=k, **kw)
    eng: LLMEngine = llm.engine
    if continuations is None:
        eng.runner = PlainArgmaxRunner(model, eng.config)
    else:
        eng.runner = OracleRunner(model, eng.config, continuations)
    eng.runner.max_model_len = eng.max_model_len
    return llm


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_with_mtp_drafts_is_identical(tiny_model, prompts, baseline, k):
    llm = LLM(
        tiny_model, block_size=4, num_kv_blocks=256, max_num_batched_tokens=32, speculative="mtp", num_draft_tokens=k
    )
    same_outputs(llm.generate(prompts, greedy()), baseline)
    m = llm.engine.metrics()
    assert m.spec_draft_tokens_total > 0 and m.spec_mean_acceptance_length >= 1.0
    assert llm.engine.block_manager.num_free_blocks == 256


@pytest.mark.parametrize("attn_impl", ["fast", "plain"])
def test_accepted_runs_roll_back_and_stay_identical(tiny_model, prompts, baseline, attn_impl):
    conts = {tuple(p): p + b.token_ids for p, b in zip(prompts, baseline, strict=True)}
    llm = oracle_llm(tiny_model, conts, block_size=4, num_kv_blocks=256, max_num_batched_tokens=32, attn_impl=attn_impl)
    same_outputs(llm.generate(prompts, greedy()), baseline)
    m = llm.engine.metrics()
    met = llm.engine.runner.spec_metrics
    assert m.spec_mean_acceptance_length > 1.8  # the oracle makes 0..3 of 3 drafts right
    assert 0 < met.accepted_at[2] < met.accepted_at[1] < met.accepted_at[0]
    assert m.generation_tokens_total == len(prompts) * MAX_TOKENS
    assert m.num_steps < 10  # 14 tokens in far fewer steps than 14
    assert llm.engine.block_manager.num_free_blocks == 256


def test_stop_token_and_max_tokens_inside_an_accepted_run(tiny_model, prompts, baseline):
    conts = {tuple(p): p + b.token_ids for p, b in zip(prompts, baseline, strict=True)}
    stop_tok = baseline[1].token_ids[6]
    params = [greedy(max_tokens=n, stop_token_ids=[stop_tok]) for n in (9, 14, 10, 7)]
    ref = LLM(tiny_model, block_size=4, num_kv_blocks=256).generate(prompts, params)
    outs = oracle_llm(tiny_model, conts, block_size=4, num_kv_blocks=256).generate(prompts, params)
    same_outputs(outs, ref)
    assert outs[1].finish_reason == "stop" and outs[1].token_ids[-1] == stop_tok


def test_preemption_and_prefix_caching_with_speculation(tiny_model, prompts, baseline):
    conts = {tuple(p): p + b.token_ids for p, b in zip(prompts, baseline, strict=True)}
    # 24 blocks of 4 = 96 slots for 80 prompt + 56 output tokens + lookahead: sequences get preempted.
    llm = oracle_llm(tiny_model, conts, block_size=4, num_kv_blocks=24, max_num_batched_tokens=64)
    same_outputs(llm.generate(prompts, greedy()), baseline)
    assert llm.engine.metrics().num_preemptions > 0
    # Same prompts again: prefix-cache hits, and the same outputs.
    same_outputs(llm.generate(prompts, greedy()), baseline)
    assert llm.engine.metrics().prefix_cache_hit_rate > 0
    assert llm.engine.block_manager.num_free_blocks == 24


@pytest.mark.parametrize("num_kv_blocks", [256, 16])
def test_engine_drafts_are_the_plain_models_chained_drafts(tiny_model, prompts, num_kv_blocks):
    """The paged MTP cache (extend from main hiddens, chained drafts, carried hidden across prefill chunks,
    sparse past index_topk, a step's extend skipping the position the previous one wrote, preemption that
    frees it) proposes exactly what the plain model computes from scratch."""
    llm = LLM(
        tiny_model,
        block_size=4,
        num_kv_blocks=num_kv_blocks,  # 16 blocks of 4 are too few for all four: sequences get preempted
        max_num_batched_tokens=16,  # the 23- and 41-token prompts are prefilled in chunks
        enable_prefix_caching=False,
        speculative="mtp",
        num_draft_tokens=3,
    )
    eng = llm.engine
    for p in prompts:
        eng.add_request(p, greedy(max_tokens=10))
    checked = 0
    while eng.has_unfinished:
        eng.step()
        for seq in eng.scheduler.running:
            drafts = seq.spec.draft_token_ids if seq.spec else []
            if drafts:
                assert drafts == mtp_drafts(tiny_model, seq.token_ids, len(drafts)), seq.request_id
                checked += 1
    assert checked >= 10
    assert (eng.metrics().num_preemptions > 0) == (num_kv_blocks < 100)


def test_each_position_is_extended_once_without_preemption(tiny_model, prompts):
    """Every position gets one MTP entry from the extend: a prompt's positions 1.. once, then each decode
    step only the tokens it emitted (the newest position before them was written by the step before)."""
    llm = LLM(tiny_model, block_size=4, num_kv_blocks=256, speculative="mtp", num_draft_tokens=3)
    out = llm.generate(prompts, greedy(max_tokens=10))
    m = llm.engine.runner.spec_metrics
    assert m.num_verifications > 0
    assert m.num_extend_rows == sum(len(p) + len(o.token_ids) - 1 for p, o in zip(prompts, out, strict=True))


def test_plain_reference_matches_plain_greedy(tiny_model, prompts, baseline):
    res = speculative_greedy(tiny_model, prompts[1], k=3, max_tokens=8)  # 23 tokens: past index_topk
    assert res.tokens == baseline[1].token_ids[:8]
    assert len(res.accepted) >= 2 and res.acceptance_length >= 1.0


@torch.inference_mode()
def test_sampled_tokens_carry_target_logprobs(tiny_model, prompts, baseline):
    """temperature > 0: every emitted token's logprob is the target's (tempered, top-k) distribution at its
    position, computed here by the plain model over the final sequence; accepted drafts included."""
    params = SamplingParams(temperature=0.5, top_k=20, max_tokens=10, ignore_eos=True, seed=3)
    llm = oracle_llm(tiny_model, block_size=4, num_kv_blocks=256)
    outs = llm.generate(prompts[:3], params)
    met = llm.engine.runner.spec_metrics
    assert 0 < met.num_accepted_tokens < met.num_draft_tokens  # both branches of the rule ran
    for p, out in zip(prompts[:3], outs, strict=True):
        seq = p + out.token_ids
        logits = tiny_model(torch.tensor([seq]))[0]
        target = processed_logprobs(logits[len(p) - 1 : -1], params)
        for j, lp in enumerate(out.logprobs):
            assert lp.logprob == pytest.approx(float(target[j, lp.token_id]), abs=1e-4)
            assert lp.logprob > float("-inf")


def test_sampling_with_real_mtp_drafts_and_penalties_runs(tiny_model, prompts):
    params = [
        SamplingParams(temperature=0.9, max_tokens=10, ignore_eos=True, seed=1),
        SamplingParams(temperature=0.9, max_tokens=10, ignore_eos=True, seed=2, presence_penalty=0.5),
    ]
    llm = LLM(tiny_model, block_size=4, num_kv_blocks=256, speculative="mtp", num_draft_tokens=2)
    outs = llm.generate(prompts[:2], params)
    assert [len(o.token_ids) for o in outs] == [10, 10]
    again = LLM(tiny_model, block_size=4, num_kv_blocks=256, speculative="mtp", num_draft_tokens=2)
    assert [o.token_ids for o in again.generate(prompts[:2], params)] == [o.token_ids for o in outs]  # seeded


def test_llm_from_a_checkpoint_directory(tiny_model, prompts, baseline, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), speculative="mtp", num_draft_tokens=3, block_size=4, num_kv_blocks=256)
    outs = llm.generate(prompts[:2], greedy())
    assert [o.token_ids for o in outs] == [b.token_ids for b in baseline[:2]]
    assert llm.engine.metrics().spec_acceptance_rate is not None


def test_bad_speculative_settings_are_named(tiny_model):
    with pytest.raises(ValueError, match="speculative must be"):
        LLM(tiny_model, speculative="eagle")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        LLM(tiny_model, speculative="mtp", num_draft_tokens=0)
    from model.modeling import GLM5ForCausalLM

    no_mtp = GLM5ForCausalLM.from_config(tiny_model.config.replace(num_nextn_predict_layers=0), seed=0)
    with pytest.raises(ValueError, match="MTP layer"):
        LLM(no_mtp, speculative="mtp")


def test_stop_string_inside_an_accepted_run_ends_where_plain_decoding_does(tiny_model, prompts, baseline):
    from model.tokenizer import Tokenizer

    tok = Tokenizer.shipped()
    conts = {tuple(p): p + b.token_ids for p, b in zip(prompts, baseline, strict=True)}
    text = tok.decode(baseline[2].token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # a string that first completes mid-output
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop])
    ref = LLM(tiny_model, tokenizer=tok, block_size=4, num_kv_blocks=256).generate(prompts, params)
    llm = oracle_llm(tiny_model, conts, tokenizer=tok, block_size=4, num_kv_blocks=256)
    outs = llm.generate(prompts, params)
    assert ref[2].finish_reason == "stop" and ref[2].stop_reason == stop
    for a, b in zip(outs, ref, strict=True):
        assert (a.token_ids, a.text, a.finish_reason, a.stop_reason) == (
            b.token_ids,
            b.text,
            b.finish_reason,
            b.stop_reason,
        )
        assert len(a.logprobs) == len(a.token_ids)
    assert llm.engine.metrics().spec_accepted_tokens_total > 0


def test_async_streaming_delivers_accepted_runs(tiny_model, prompts, baseline):
    import asyncio

    from serve import AsyncLLM

    conts = {tuple(p): p + b.token_ids for p, b in zip(prompts, baseline, strict=True)}
    alm = AsyncLLM(oracle_llm(tiny_model, conts, block_size=4, num_kv_blocks=64).engine)

    async def stream():
        seen = []
        async for out in alm.generate(prompts[1], greedy()):
            seen.append(len(out.token_ids))
        return seen, out

    try:
        seen, last = asyncio.run(stream())
    finally:
        alm.shutdown()
    assert last.token_ids == baseline[1].token_ids
    assert seen == sorted(seen) and seen[-1] == MAX_TOKENS
    assert len(seen) < MAX_TOKENS  # several tokens per streamed output


def test_cache_sized_from_memory_counts_the_mtp_layer(tiny_model):
    gib = 1 / 1024  # 1 MiB
    kv = LLM(tiny_model, kv_cache_gib=gib, speculative="mtp").engine.runner.kv
    assert len(kv.latent_NPK) == tiny_model.config.num_hidden_layers + 1  # the MTP layer is one more layer
    assert gib * 2**30 * 0.95 < kv.num_bytes <= gib * 2**30


def _spec_llm(model, **kw) -> LLM:
    return LLM(model, block_size=4, num_kv_blocks=256, max_num_batched_tokens=32, speculative="mtp", **kw)


def test_a_draft_vocabulary_only_changes_drafts(tiny_model, prompts, baseline):
    """Drafts come from the set only (every draft token, every step), outputs stay identical, and the set of
    all tokens drafts exactly what the full lm_head drafts."""
    V = tiny_model.config.vocab_size
    full = _spec_llm(tiny_model)
    same_outputs(full.generate(prompts, greedy()), baseline)
    # The set: half the vocabulary, with a token the full drafter proposes left out.
    vocab = tuple(range(0, V, 2))
    llm = _spec_llm(tiny_model, draft_vocab=vocab)
    drafted: list[int] = []
    run = llm.engine.runner._draft

    def spy(drafting, z):
        run(drafting, z)
        drafted.extend(t for d in drafting for t in d[0].spec.draft_token_ids)

    llm.engine.runner._draft = spy
    same_outputs(llm.generate(prompts, greedy()), baseline)
    assert drafted and set(drafted) <= set(vocab)
    everything = _spec_llm(tiny_model, draft_vocab=tuple(range(V)))
    same_outputs(everything.generate(prompts, greedy()), baseline)
    a, b = everything.engine.runner.spec_metrics, full.engine.runner.spec_metrics
    assert (a.num_draft_tokens, a.accepted_at) == (b.num_draft_tokens, b.accepted_at)


def test_draft_vocabulary_under_sampling_keeps_target_logprobs(tiny_model, prompts):
    params = SamplingParams(temperature=0.8, top_k=50, max_tokens=10, ignore_eos=True, seed=5)
    llm = _spec_llm(tiny_model, draft_vocab=tuple(range(1, tiny_model.config.vocab_size, 3)))
    outs = llm.generate(prompts[:3], params)
    for p, out in zip(prompts[:3], outs, strict=True):
        with torch.no_grad():
            logits = tiny_model(torch.tensor([p + out.token_ids]))[0]
        target = processed_logprobs(logits[len(p) - 1 : -1], params)
        for j, lp in enumerate(out.logprobs):
            assert lp.logprob == pytest.approx(float(target[j, lp.token_id]), abs=1e-4)


def test_draft_head_follows_lm_head_updates(tiny_model):
    llm = _spec_llm(tiny_model, draft_vocab=(3, 1, 7))
    runner = llm.engine.runner
    z = torch.randn(2, tiny_model.config.hidden_size)
    w = tiny_model.lm_head.weight
    saved = w.detach().clone()
    try:
        with torch.inference_mode():
            first = runner._draft_logits(z)
            assert torch.isinf(first[:, 0]).all() and torch.isfinite(first[:, [1, 3, 7]]).all()
            assert close(first[:, [1, 3, 7]], z @ w[[1, 3, 7]].T, 1e-5)
        with torch.no_grad():
            w.mul_(2.0)  # an optimizer step or a load_state_dict writes in place
        with torch.inference_mode():
            assert close(runner._draft_logits(z)[:, [1, 3, 7]], 2 * first[:, [1, 3, 7]], 1e-5)
    finally:
        with torch.no_grad():
            w.copy_(saved)


def test_bad_draft_vocabularies_are_named(tiny_model):
    V = tiny_model.config.vocab_size
    for vocab, msg in [
        ((), "empty"),
        ((1, 1), "distinct"),
        ((-1, 2), "non-negative"),
        ((1, V), "beyond the vocabulary"),
    ]:
        with pytest.raises(ValueError, match=msg):
            _spec_llm(tiny_model, draft_vocab=vocab)
    with pytest.raises(ValueError, match="only used with speculative"):
        LLM(tiny_model, draft_vocab=(1, 2))


def test_draft_vocabulary_files_round_trip(tmp_path):
    write_draft_vocab(tmp_path / "v.json", [5, 3, 9], coverage=0.99)
    assert read_draft_vocab(tmp_path / "v.json") == (3, 5, 9)
    (tmp_path / "bare.json").write_text("[4, 2]")
    assert read_draft_vocab(tmp_path / "bare.json") == (4, 2)
