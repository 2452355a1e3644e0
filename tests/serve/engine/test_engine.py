"""The engine against the plain model: greedy equality (batched, prefix cache, preemption, sparse), logprobs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.config import preset
from model.indexer import Indexer
from model.modeling import GLM5ForCausalLM
from model.norms import RMSNorm
from serve import LLM, SamplingParams
from serve.engine.config import EngineConfig
from serve.engine.engine import LLMEngine
from serve.engine.fast_layer import rms_norm
from tests.model.conftest import close
from tests.serve.engine.conftest import plain_greedy, random_prompts

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def reference(tiny_model):
    # Lengths on both sides of index_topk (16) and of block boundaries; 41 > 16: sparse from the first token.
    prompts = random_prompts([5, 23, 11, 41], tiny_model.config.vocab_size, seed=1)
    return prompts, [plain_greedy(tiny_model, p, MAX_TOKENS) for p in prompts]


def check_against_reference(outs, reference):
    prompts, refs = reference
    for out, prompt, (ref_tokens, ref_logprobs) in zip(outs, prompts, refs, strict=True):
        assert out.prompt_token_ids == prompt
        assert out.token_ids == ref_tokens
        assert out.finish_reason == "length"
        for lp, ref in zip(out.logprobs, ref_logprobs, strict=True):
            assert lp.logprob == pytest.approx(ref[lp.token_id].item(), abs=1e-4)
            top = ref.topk(3)
            assert list(lp.top) == top.indices.tolist()
            assert list(lp.top.values()) == pytest.approx(top.values.tolist(), abs=1e-4)


@pytest.mark.parametrize("attn_impl", ["fast", "plain"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_batch_of_different_lengths_matches_plain_greedy(tiny_model, reference, attn_impl, prefix_caching):
    llm = LLM(
        tiny_model,
        block_size=4,
        num_kv_blocks=128,
        max_num_batched_tokens=32,  # the 41-token prompt is prefilled in two chunks
        attn_impl=attn_impl,
        enable_prefix_caching=prefix_caching,
    )
    check_against_reference(llm.generate(reference[0], GREEDY), reference)
    assert not llm.engine.has_unfinished and llm.engine.block_manager.num_free_blocks == 128


def test_preemption_with_a_tiny_cache_still_matches(tiny_model, reference):
    # 24 blocks of 4 = 96 slots for ~80 prompt + 32 output tokens: sequences get preempted and recomputed.
    llm = LLM(tiny_model, block_size=4, num_kv_blocks=24, max_num_batched_tokens=64)
    outs = llm.generate(reference[0], GREEDY)
    assert llm.engine.metrics().num_preemptions > 0
    check_against_reference(outs, reference)


def test_shared_prefix_is_reused_and_gives_the_same_tokens(tiny_model):
    system = random_prompts([24], tiny_model.config.vocab_size, seed=7)[0]
    a, b = system + [11, 12, 13], system + [21, 22]
    llm = LLM(tiny_model, block_size=4, num_kv_blocks=64)
    first = llm.generate(a, GREEDY)[0]
    second = llm.generate(b, GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 24  # 6 full blocks of the shared system prompt skipped their prefill
    assert llm.engine.metrics().prefix_cache_hit_rate > 0
    assert second.token_ids == plain_greedy(tiny_model, b, MAX_TOKENS)[0]


def test_requests_joining_a_running_batch_match(tiny_model, reference):
    prompts, refs = reference
    engine = LLMEngine(tiny_model, config=EngineConfig(block_size=4, num_kv_blocks=128))
    finished = {}
    engine.add_request(prompts[0], GREEDY, request_id="0")
    for step in range(40):
        if step < len(prompts) - 1:
            engine.add_request(prompts[step + 1], GREEDY, request_id=str(step + 1))
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.token_ids
        if not engine.has_unfinished:
            break
    assert [finished[str(i)] for i in range(len(prompts))] == [r[0] for r in refs]


@pytest.mark.parametrize("sparse_prefill", ["gather", "mask"])
def test_fast_path_agrees_with_the_plain_path(tiny_model, sparse_prefill):
    """The fast path (fused projections; sparse prefill by gathered top-k latents or by a top-k mask on
    expanded attention; one padded absorbed-MLA call over gathered top-k latents for the decodes) against
    the plain path (the model's own modules and attention on each
    sequence's gathered context): logits of a prefill step and of a decode step, to rounding."""
    prompts = random_prompts([40, 9, 30], tiny_model.config.vocab_size, seed=3)
    logits = {}
    for impl in ("plain", "fast"):
        cfg = EngineConfig(block_size=4, num_kv_blocks=64, attn_impl=impl, sparse_prefill=sparse_prefill)
        engine = LLMEngine(tiny_model, config=cfg)
        for p in prompts:
            engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=3))
        chunks = engine.scheduler.schedule()  # prefill of all three; 40 and 30 > index_topk: sparse
        prefill = engine.runner.forward(engine.runner.prepare(chunks))
        engine.scheduler.postprocess(chunks, engine.runner.sampler(prefill, [c.seq for c in chunks]))
        chunks = engine.scheduler.schedule()  # a decode step for the three
        assert all(c.num_tokens == 1 for c in chunks)
        logits[impl] = (prefill, engine.runner.forward(engine.runner.prepare(chunks)))
    for fast, plain in zip(logits["fast"], logits["plain"], strict=True):
        assert close(fast, plain, 1e-5)


def test_seeded_sampling_is_independent_of_the_batch(tiny_model):
    prompts = random_prompts([12, 20, 7], tiny_model.config.vocab_size, seed=5)
    mine = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=6, ignore_eos=True)
    alone = LLM(tiny_model, num_kv_blocks=64, block_size=4).generate(prompts[0], mine)[0]
    others = [SamplingParams(temperature=1.0, seed=s, max_tokens=6, ignore_eos=True) for s in (1, 2)]
    crowd = LLM(tiny_model, num_kv_blocks=64, block_size=4).generate(prompts, [mine] + others)
    assert crowd[0].token_ids == alone.token_ids
    assert crowd[1].token_ids != crowd[0].token_ids


def test_bad_prompts_are_rejected(tiny_model):
    llm = LLM(tiny_model, num_kv_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, tiny_model.config.vocab_size]])
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello")
    with pytest.raises(ValueError, match="do not fit"):
        llm.generate([list(range(40))])


def test_update_weights_bumps_the_version_and_drops_the_prefix_cache(tiny_model):
    llm = LLM(tiny_model, num_kv_blocks=32, block_size=4)
    p = list(range(1, 20))
    llm.generate(p, GREEDY)
    name = "model.norm.weight"
    version = llm.engine.update_weights({name: tiny_model.get_parameter(name).detach().clone()})
    assert version == 1 and llm.engine.block_manager.hash_to_block == {}
    out = llm.generate(p, GREEDY)[0]
    assert out.num_cached_tokens == 0 and out.weights_version == 1
    with pytest.raises(KeyError, match="not parameters or buffers"):
        llm.engine.update_weights({"nope": torch.zeros(1)})


def test_fast_path_keeps_one_copy_of_the_expert_weights():
    """The runner's fusion reuses the MoE's own stacked expert weights instead of concatenating a second copy,
    and batched steps still match the plain path (checked above); here: every expert weight still views the
    model's stack after the engine has run a batch."""
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=3).eval()
    llm = LLM(model, num_kv_blocks=64)
    llm.generate(random_prompts([6, 9, 12], model.config.vocab_size, seed=2), SamplingParams(max_tokens=3))
    for layer in model.model.layers:
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            with torch.no_grad():
                assert mlp._stacked_ok()
            for e, ex in enumerate(mlp.experts):
                assert ex.gate_proj.weight.data_ptr() == mlp._gate_up[e].data_ptr()


def test_replacing_the_experts_after_fusion_makes_the_runner_fuse_again():
    """The runner decides once per fusion whether the experts view the MoE's stack (the check walks every
    expert, too slow per step). Replacing the expert weights afterwards must be noticed: the next step fuses
    again, takes the per-expert path and matches the plain model with the new weights."""
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=4).eval()
    llm = LLM(model, num_kv_blocks=64)
    prompts = random_prompts([7, 11, 5], model.config.vocab_size, seed=5)
    llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0))
    runner = llm.engine.runner
    assert any(f.stacked for f in runner.fused)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for layer in model.model.layers:
            for ex in getattr(layer.mlp, "experts", []):
                for lin in (ex.gate_proj, ex.up_proj, ex.down_proj):  # new tensors: the tie to the stack breaks
                    lin.weight = torch.nn.Parameter(torch.randn(lin.weight.shape, generator=g) * 0.2)
    assert not all(f.is_current() for f in runner.fused)
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0))
    assert not any(f.stacked for f in runner.fused)
    for p, out in zip(prompts, outs, strict=True):
        assert out.token_ids == plain_greedy(model, p, 4)[0]


def test_int4_layers_are_fused_once_not_every_step(monkeypatch):
    """With INT4 linears nothing can be fused, and the runner must still see its fusion as current: it used to
    fuse every layer again at every step. A module swapped in later (here the INT4 expert back to a Linear) is
    still noticed."""
    import serve.engine.model_runner as mr
    from model.quant_int4 import quantize_int4

    model = quantize_int4(GLM5ForCausalLM.from_config(preset("tiny"), seed=4).eval(), group_size=32, strict=False)
    calls = []
    real = mr.fuse_layer
    monkeypatch.setattr(mr, "fuse_layer", lambda layer: calls.append(1) or real(layer))
    llm = LLM(model, num_kv_blocks=64)
    llm.generate(random_prompts([7, 11], model.config.vocab_size, seed=5), SamplingParams(max_tokens=6))
    assert len(calls) == model.config.num_hidden_layers  # once per layer, for all the steps
    ex = model.model.layers[1].mlp.experts[0]
    ex.gate_proj = torch.nn.Linear(ex.gate_proj.in_features, ex.gate_proj.out_features, bias=False)
    assert not llm.engine.runner.fused[1].is_current()


def test_lora_injected_after_serving_is_served():
    """peft's LoRA wrappers keep their base layer's `.weight`, so a fused projection still looked current after
    injection and the engine went on ignoring the adapters. Now the swap is noticed and the engine generates
    what the plain model with LoRA does (RL injects LoRA into a model an engine may already serve)."""
    from finetune.grpo import RL_TARGETS
    from finetune.sft import LoraSettings, add_lora

    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=4).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # a trained head's range, so the adapters change the greedy tokens
    llm = LLM(model, num_kv_blocks=64)
    prompts = random_prompts([7, 11], model.config.vocab_size, seed=5)
    before = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))]
    add_lora(model, LoraSettings(rank=4, targets=RL_TARGETS), seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    outs = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))]
    assert outs == [plain_greedy(model, p, 6)[0] for p in prompts]
    assert outs != before


def test_the_model_can_be_trained_after_the_engine_has_served_it():
    """RL runs rollouts with the engine and then optimizer steps on the same model. The runner's weight
    fusion re-points the model's parameters to new storage while it serves (inside inference_mode); that
    storage must be ordinary tensors, or backward fails on inference tensors."""
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=6).eval()
    llm = LLM(model, num_kv_blocks=64)
    prompts = random_prompts([9, 20], model.config.vocab_size, seed=7)
    llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0))
    assert not model.model.layers[0].self_attn.q_a_proj.weight.is_contiguous()  # fused input-major views
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ids = torch.tensor([prompts[1]])
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
    loss.backward()
    assert model.model.layers[0].self_attn.q_a_proj.weight.grad is not None
    assert model.lm_head.weight.grad is not None
    opt.step()  # in place: the engine's fused views see the new weights
    model.eval()
    with torch.no_grad():
        llm.engine.update_weights({})  # drop the prefix cache computed with the old weights
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0))
    for p, out in zip(prompts, outs, strict=True):
        assert out.token_ids == plain_greedy(model, p, 3)[0]


def test_a_model_saved_after_serving_reloads_with_the_same_logits(tmp_path):
    """Serving re-points the model's parameters to transposed views of fused storage; saving must still write
    an ordinary checkpoint that reloads to the same function."""
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=8).eval()
    ids = torch.tensor(random_prompts([30], model.config.vocab_size, seed=9))
    with torch.no_grad():
        before = model(ids)
    LLM(model, num_kv_blocks=64).generate([ids[0].tolist()], SamplingParams(max_tokens=2))
    assert not model.lm_head.weight.is_contiguous()  # the engine's input-major view
    model.save_pretrained(tmp_path)
    reloaded = GLM5ForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(ids), before)
        assert torch.equal(model(ids), before)


@pytest.mark.parametrize("rows, dim", [(1, 64), (3, 64), (40, 384), (100, 768), (512, 768)])
def test_fast_path_rms_norm_gives_the_modules_bits(rows, dim):
    """`rms_norm` (F.rms_norm for a few values where it matches on this machine, the module's in-place path for
    many) computes exactly what the model's RMSNorm does, on a strided view too (the fast path normalises slices
    of a fused projection)."""
    norm = RMSNorm(dim, 1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(rows, dim + 32)[:, 16 : 16 + dim]
    with torch.inference_mode():
        want = norm(x)
        assert torch.equal(rms_norm(norm, x), want)
        assert close(F.rms_norm(x, (dim,), norm.weight, norm.eps), want, 1e-6)  # same bits only where checked


def test_index_queries_only_for_rows_that_get_scores(tiny_model, monkeypatch):
    """A prefill chunk's first index_topk - start rows see fewer keys than the budget and select them all: the
    indexer makes queries only for the rows after them (and in a chunk that starts past the budget, all). The
    last layer makes queries only for the row it samples, and none in a chunk that does not sample."""
    K = tiny_model.config.index_topk
    rows = []
    real = Indexer.queries
    monkeypatch.setattr(Indexer, "queries", lambda self, qr, *a: rows.append(qr.shape[1]) or real(self, qr, *a))
    layers = tiny_model.model.layers[: tiny_model.config.num_hidden_layers]
    n_ix = sum(layer.self_attn.indexer is not None for layer in layers)
    last_ix = layers[-1].self_attn.indexer is not None
    prompt = random_prompts([K + 9], tiny_model.config.vocab_size, seed=5)[0]
    engine = LLMEngine(tiny_model, config=EngineConfig(block_size=4, num_kv_blocks=64, max_num_batched_tokens=K + 4))
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.step()  # rows 0..K+3: queries for the last 4 (the chunk does not sample: none in the last layer)
    assert rows == [4] * (n_ix - last_ix)
    rows.clear()
    engine.step()  # rows K+4..K+8, all past the budget; the last layer: the sampled row
    assert rows == [5] * (n_ix - last_ix) + [1] * last_ix
    out = engine.step()[0]
    assert out.token_ids == plain_greedy(tiny_model, prompt, 2)[0]


@pytest.mark.parametrize("last_indexer", ["full", "shared"])
def test_last_layer_runs_only_the_sampled_rows(last_indexer):
    """The fast path's last layer writes every row's cache entries but runs its queries, attention and MoE only
    for the rows that are sampled (one per chunk that ends a prompt or decodes; none for a chunk in the middle of
    a prompt). The logits and every later step still match the plain path (which runs every row), including a
    last layer that reuses the previous layer's top-k ('shared')."""
    cfg = preset("tiny").replace(indexer_types=("full", "full", last_indexer))
    model = GLM5ForCausalLM.from_config(cfg, seed=6).eval()
    prompts = random_prompts([40, 9, 30], cfg.vocab_size, seed=11)
    seen: list[int] = []
    router = model.model.layers[cfg.num_hidden_layers - 1].mlp.gate
    hook = router.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    try:
        logits = {}
        for impl in ("plain", "fast"):
            engine = LLMEngine(model, config=EngineConfig(block_size=4, num_kv_blocks=64, attn_impl=impl))
            for p in prompts:
                engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=3))
            steps = []
            for _ in range(3):  # the prefill of all three, then two decode steps
                chunks = engine.scheduler.schedule()
                seen.clear()
                step_logits = engine.runner.forward(engine.runner.prepare(chunks))
                engine.scheduler.postprocess(chunks, engine.runner.sampler(step_logits, [c.seq for c in chunks]))
                steps.append(step_logits)
                assert seen == [sum(c.num_tokens for c in chunks) if impl == "plain" else len(chunks)]
            logits[impl] = steps
        for fast, plain in zip(logits["fast"], logits["plain"], strict=True):
            assert close(fast, plain, 1e-5)

        # A prompt prefilled in chunks: the first chunk samples nothing, so its last layer only writes the cache.
        engine = LLMEngine(model, config=EngineConfig(block_size=4, num_kv_blocks=64, max_num_batched_tokens=24))
        engine.add_request(prompts[0], GREEDY)
        seen.clear()
        engine.step()
        assert seen == []
        out = None
        while engine.has_unfinished:
            (out,) = engine.step()
        assert out.token_ids == plain_greedy(model, prompts[0], MAX_TOKENS)[0]
    finally:
        hook.remove()
