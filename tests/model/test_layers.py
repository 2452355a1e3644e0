"""Each fast path against its plain reference, and each piece against a transcription of its formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import GLM5ForCausalLM
from model.attention import MLA
from model.indexer import Indexer
from model.kv_cache import KVCache
from model.moe import MoE
from model.rope import apply_rope, rope_cos_sin
from tests.model.conftest import close, randomize, tiny


def _inputs(cfg, B=2, T=24):
    x = torch.randn(B, T, cfg.hidden_size)
    cos, sin = rope_cos_sin(torch.arange(T).expand(B, T), cfg.qk_rope_head_dim, cfg.rope_base)
    return x, cos, sin, torch.arange(T)


def test_rope_is_the_interleaved_pair_rotation():
    # Rotating pair (x_2i, x_2i+1) by angle p*f_i is multiplying the complex number x_2i + j x_2i+1 by e^{j p f_i}.
    R, theta = 8, 10000.0
    q, k = torch.randn(5, R), torch.randn(5, R)
    pos = torch.arange(5)
    cos, sin = rope_cos_sin(pos, R, theta)
    rot = torch.polar(torch.ones(5, R // 2), torch.atan2(sin, cos))
    qc = torch.view_as_real(torch.view_as_complex(q.view(5, R // 2, 2)) * rot).flatten(1)
    kc = torch.view_as_real(torch.view_as_complex(k.view(5, R // 2, 2)) * rot).flatten(1)
    ours = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).T
    assert close(ours, qc @ kc.T, 1e-5)


def test_indexer_scores_match_the_formula():
    cfg = tiny()
    ix = randomize(Indexer(cfg))
    x, cos, sin, q_idx = _inputs(cfg, B=1, T=7)
    qr = torch.randn(1, 7, cfg.q_lora_rank)
    q, k = ix.queries(qr, cos, sin), ix.keys(x, cos, sin)
    w = ix.weights_proj(x) * cfg.index_n_heads**-0.5
    expect = torch.zeros(1, 7, 7)
    for t in range(7):
        for s in range(7):
            expect[0, t, s] = sum(
                w[0, t, h] * F.relu(q[0, t, h] @ k[0, s] * cfg.index_head_dim**-0.5) for h in range(cfg.index_n_heads)
            )
    assert close(ix.scores(q, x, k), expect, 1e-5)
    # keys: LayerNorm with bias, then rope on the first R dims only
    raw = F.layer_norm(ix.wk(x), (cfg.index_head_dim,), ix.k_norm.weight, ix.k_norm.bias, 1e-6)
    assert close(k[..., cfg.qk_rope_head_dim :], raw[..., cfg.qk_rope_head_dim :], 1e-6)


def test_indexer_topk_is_causal_and_skipped_when_everything_fits():
    cfg = tiny(index_topk=4)
    ix = randomize(Indexer(cfg))
    x, cos, sin, q_idx = _inputs(cfg, B=1, T=12)
    q, k = ix.queries(torch.randn(1, 12, cfg.q_lora_rank), cos, sin), ix.keys(x, cos, sin)
    topk = ix.select(q, x, k, q_idx)
    scores = ix.scores(q, x, k)[0]
    for t in range(4, 12):  # rows with >= K visible keys pick the K best visible ones
        visible = scores[t, : t + 1]
        assert set(topk[0, t].tolist()) == set(visible.topk(4).indices.tolist())
    assert Indexer(cfg.replace(index_topk=12)).select(q, x, k, q_idx) is None


def test_sparse_gather_path_equals_dense_mask_path():
    cfg = tiny()
    mla = randomize(MLA(cfg))
    x, cos, sin, q_idx = _inputs(cfg, T=40)
    q_nope, q_pe, _ = mla.project_q(x, cos, sin)
    c_kv, k_pe = mla.project_kv(x, cos, sin)
    r = torch.rand(2, 40, 40)
    r[:, q_idx, q_idx] = 2.0  # distinct random picks (like a real top-k), every query keeping itself
    topk = r.topk(cfg.index_topk, dim=-1).indices
    for idx in (topk, None):
        dense = mla.attend_expanded(q_nope, q_pe, c_kv, k_pe, q_idx, idx)
        sparse = mla.attend_absorbed(q_nope, q_pe, c_kv, k_pe, q_idx, idx)
        assert close(dense, sparse, 1e-5)


def _absorbed_by_einsum(mla, q_nope, q_pe, c_kv, k_pe, q_idx):
    """attend_absorbed's dense branch as first written, with einsum: the reference for its batched GEMMs."""
    w = mla._kv_b_weight()
    w_uk, w_uv = w[:, : mla.dn], w[:, mla.dn :]
    q_abs = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)
    scores = torch.einsum("bthc,bsc->bths", q_abs, c_kv) + torch.einsum("bthr,bsr->bths", q_pe, k_pe)
    visible = torch.arange(c_kv.shape[1]) <= q_idx[..., None]
    scores = scores.float().mul_(mla.scale).masked_fill_(~visible[..., None, :], float("-inf"))
    o_lat = torch.einsum("bths,bsc->bthc", scores.softmax(-1).to(c_kv.dtype), c_kv)
    return torch.einsum("bthc,hvc->bthv", o_lat, w_uv)


@pytest.mark.parametrize("B, T, S", [(1, 1, 40), (2, 3, 17), (3, 1, 9)])
def test_absorbed_attention_gemms_give_einsums_bits(B, T, S):
    cfg = tiny()
    mla = randomize(MLA(cfg))
    H, R = cfg.num_attention_heads, cfg.qk_rope_head_dim
    q_nope = torch.randn(B, T, H, cfg.qk_nope_head_dim)
    q_pe, c_kv, k_pe = torch.randn(B, T, H, R), torch.randn(B, S, cfg.kv_lora_rank), torch.randn(B, S, R)
    q_idx = torch.arange(S - T, S) if B == 1 else torch.stack([torch.arange(S - T - b, S - b) for b in range(B)])
    with torch.no_grad():
        got = mla.attend_absorbed(q_nope, q_pe, c_kv, k_pe, q_idx)
        # The same GEMMs einsum plans (the same bits on the machines measured; another BLAS build may block them
        # otherwise, so up to rounding).
        assert close(got, _absorbed_by_einsum(mla, q_nope, q_pe, c_kv, k_pe, q_idx), 1e-6)


def untie(moe: MoE) -> MoE:
    """A copy of the MoE whose experts own their weights (the same values): the per-expert fast path."""
    import copy

    other = copy.deepcopy(moe)
    for e in other.experts:
        for lin in (e.gate_proj, e.up_proj, e.down_proj):
            lin.weight = torch.nn.Parameter(lin.weight.detach().clone())
    return other


def test_moe_fast_path_equals_plain_loop_and_bias_only_selects():
    cfg = tiny(n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=3)
    moe = randomize(MoE(cfg))
    x = torch.randn(3, 10, cfg.hidden_size)
    out = {}
    with torch.no_grad():
        assert moe._stacked_ok()
        out["stacked"] = moe(x)  # the fast path over the stacked weights
        moe.impl = "reference"
        out["reference"] = moe(x)
        untied = untie(moe)
        untied.impl = "fast"
        assert not untied._stacked_ok()
        out["per_expert"] = untied(x)  # the fast path through each expert module
    assert close(out["stacked"], out["reference"], 1e-5)
    assert close(out["per_expert"], out["reference"], 1e-5)
    # One or two tokens (a decode step) without autograd: the per-expert path calls their experts directly.
    for n in (1, 2):
        with torch.no_grad():
            assert close(untied(x[:1, :n]), moe(x[:1, :n]), 1e-5)
    w, idx = moe.gate(x.view(-1, cfg.hidden_size))
    assert ((idx // 4) == (idx[:, :1] // 4)).all()  # group-limited: all picks in one group of 4
    assert torch.allclose(w.sum(-1), torch.full((30,), cfg.routed_scaling_factor))
    with torch.no_grad():
        moe.gate.e_score_correction_bias[5] = 100.0  # forces expert 5 into every selection...
    w2, idx2 = moe.gate(x.view(-1, cfg.hidden_size))
    assert (idx2 == 5).any(-1).all()
    s = torch.sigmoid(x.view(-1, cfg.hidden_size) @ moe.gate.weight.T)  # ...but weights use unbiased scores
    expect = s.gather(1, idx2)
    assert close(w2, expect / expect.sum(-1, keepdim=True) * cfg.routed_scaling_factor, 1e-6)


def test_incremental_greedy_decode_equals_full_recompute():
    cfg = tiny(index_topk=6, index_topk_pattern="FSF")
    model = randomize(GLM5ForCausalLM(cfg)).eval()
    prompt = torch.randint(0, cfg.vocab_size, (2, 5))
    with torch.no_grad():
        cache = KVCache.for_config(cfg)
        logits = model(prompt, cache=cache)
        seq = prompt
        for _ in range(6):  # past index_topk: decode steps take the sparse path
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            logits = model(nxt, cache=cache)
            full = model(seq)
            assert close(logits[:, -1], full[:, -1], 1e-4)
        assert cache.length == seq.shape[1] and cache.layers[1].index_k is None  # 'shared' layer: no index keys
        # roll back 3 tokens (as after rejected drafts) and feed others: same as computing from scratch
        cache.truncate(seq.shape[1] - 3)
        other = torch.randint(0, cfg.vocab_size, (2, 3))
        again = model(other, cache=cache)
        assert close(again, model(torch.cat([seq[:, :-3], other], 1))[:, -3:], 1e-4)


@pytest.mark.parametrize("pattern", ["FFF", "FSS"])
def test_logits_to_keep_runs_the_last_layer_for_those_rows_and_caches_every_token(pattern):
    """logits_to_keep=n: the last n rows' logits equal the full forward's (to rounding), the last layer's MoE sees
    only n rows per sequence, every token's cache entries are made (the same as without it), and decoding on from
    that cache gives what decoding on from a full prefill gives. A 'shared' last layer slices the previous
    layer's top-k."""
    cfg = tiny(index_topk=6, index_topk_pattern=pattern)
    model = randomize(GLM5ForCausalLM(cfg)).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 17))
    rows = []
    last = model.model.layers[cfg.num_hidden_layers - 1].mlp
    hook = last.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            full_cache, kept_cache = KVCache.for_config(cfg), KVCache.for_config(cfg)
            full = model(ids, cache=full_cache)
            for n in (1, 5):
                rows.clear()
                assert close(model(ids, logits_to_keep=n), full[:, -n:], 1e-5)
                assert rows == [n]
            kept = model(ids, cache=kept_cache, logits_to_keep=1)
            assert kept.shape == (2, 1, cfg.vocab_size) and close(kept, full[:, -1:], 1e-5)
            for a, b in zip(kept_cache.layers, full_cache.layers, strict=True):
                assert torch.equal(a.c_kv, b.c_kv) and torch.equal(a.k_pe, b.k_pe)
                assert (a.index_k is None) == (b.index_k is None) and (
                    a.index_k is None or torch.equal(a.index_k, b.index_k)
                )
            nxt = full[:, -1:].argmax(-1)
            assert torch.equal(model(nxt, cache=kept_cache), model(nxt, cache=full_cache))
            assert torch.equal(model(ids, logits_to_keep=17), full)  # all of them: the plain forward
    finally:
        hook.remove()
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, logits_to_keep=-1)


def test_stacked_experts_follow_weight_changes_or_step_aside():
    cfg = tiny()
    moe = randomize(MoE(cfg))
    moe.tie_experts()  # randomize wrote in place, so the tie already held; re-tying is harmless
    x = torch.randn(12, cfg.hidden_size)
    inter, up = cfg.moe_intermediate_size, moe.experts[3].up_proj.weight
    assert up.shape == (inter, cfg.hidden_size)  # the checkpoint's [out, in], a view of the input-major stack
    assert up.data_ptr() == moe._gate_up[3, :, inter:].data_ptr() and torch.equal(up, moe._gate_up[3, :, inter:].T)
    with torch.no_grad():
        assert moe._stacked_ok()
        moe.experts[3].up_proj.weight.mul_(2.0)  # in place (as an optimizer step): the stack sees it
        assert moe._stacked_ok()
        moe.impl = "fast"
        fast = moe(x)
        moe.impl = "reference"
        assert close(fast, moe(x), 1e-5)
        moe.experts[3].up_proj.weight = torch.nn.Parameter(torch.zeros(cfg.moe_intermediate_size, cfg.hidden_size))
        assert not moe._stacked_ok()  # a replaced weight breaks the tie: 'auto' takes the module path
        moe.impl = "fast"
        fast = moe(x)
        moe.impl = "reference"
        assert close(fast, moe(x), 1e-5)
    assert not moe.double()._stacked_ok()  # .to(dtype) also breaks it
    moe.experts[0].gate_proj.weight.requires_grad_(True)
    assert moe.tie_experts() is None and not moe._stacked_ok()  # with grad enabled: the module path
    with torch.no_grad():
        assert moe._stacked_ok()
    assert moe.experts[0].gate_proj.weight.requires_grad


def test_ragged_decode_batch_with_per_sequence_indices():
    # Two sequences of 30 and 19 tokens in one padded cache: per-row q_idx hides the padding from the shorter.
    cfg = tiny()
    mla = randomize(MLA(cfg))
    x, cos, sin, _ = _inputs(cfg, B=2, T=30)
    c_kv, k_pe = mla.project_kv(x, cos, sin)
    q_nope, q_pe, qr = mla.project_q(x[:, -1:], cos[:, -1:], sin[:, -1:])
    q_idx = torch.tensor([[29], [18]])
    ix = mla.indexer
    topk = ix.select(ix.queries(qr, cos[:, -1:], sin[:, -1:]), x[:, -1:], ix.keys(x, cos, sin), q_idx)
    assert (topk[1] <= 18).all()  # never a padded key
    for impl in (mla.attend_absorbed, mla.attend_expanded):
        both = impl(q_nope, q_pe, c_kv, k_pe, q_idx, topk)
        alone = impl(q_nope[1:], q_pe[1:], c_kv[1:, :19], k_pe[1:, :19], torch.tensor([18]), topk[1:])
        assert close(both[1:], alone, 1e-5)


def test_training_takes_the_expanded_path_and_prefill_too():
    """Under autograd the absorbed path's gather has a scatter-add backward (a 2,076-token training step was 3.2x
    slower); without grad a long prefill is expanded and a decode step absorbed."""
    import dataclasses

    import torch

    from model.attention import MLA
    from model.config import preset

    mla = MLA(dataclasses.replace(preset("tiny"), index_topk=512))
    with torch.no_grad():
        assert mla.cheaper_impl(1, 4000, 512) == "absorbed"
        assert mla.cheaper_impl(2076, 2076, 512) == "expanded"
    with torch.enable_grad():
        assert mla.cheaper_impl(1, 4000, 512) == "expanded"
