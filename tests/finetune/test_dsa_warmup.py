"""DSA adaptation (finetune/dsa_warmup.py): the KL target is the layer's real attention, the dense warm-up lowers
the indexer's KL and changes nothing else, and in the sparse stage each loss reaches only its own part."""

from __future__ import annotations

import contextlib

import pytest
import torch

from finetune.dsa_warmup import (
    DSAWarmupConfig,
    LayerTap,
    attention_probs,
    attention_target,
    dense_attention,
    indexer_kl,
    indexer_log_probs,
    sparse_losses,
    train_dense_warmup,
    visible_keys,
)
from model.config import preset
from model.modeling import GLM5ForCausalLM

T = 28  # past tiny's index_topk (16): the sparse path runs


def peaky_model() -> GLM5ForCausalLM:
    """`tiny` with its attention logits scaled up: a random `tiny` attends almost uniformly (logits ~0.01), and
    so does its indexer, so there would be nothing to match; a trained model's attention is peaked."""
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        for layer in model.model.layers[: model.config.num_hidden_layers]:
            layer.self_attn.q_b_proj.weight.mul_(12.0)
            layer.self_attn.kv_b_proj.weight.mul_(12.0)
    return model


def _seqs(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(100, 600, (T,), generator=g).tolist(), 4) for _ in range(n)]


def _ids(seqs):
    return torch.tensor([s for s, _ in seqs])


@pytest.mark.parametrize("dense", [True, False])
def test_the_kl_target_is_the_attention_the_layer_ran(dense):
    """attention_probs, applied to the layer's values and o_proj, give the layer's own output (dense, and over
    the indexer's top-k): the indexer is taught the attention the model really uses."""
    model = peaky_model().eval()
    tap = LayerTap(model)
    outputs = {}
    hooks = [
        layer.self_attn.register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o[0].clone()))
        for i, layer in tap.layers.items()
    ]
    ids = _ids(_seqs(2))
    with torch.no_grad(), dense_attention(model) if dense else contextlib.nullcontext():
        model.model(ids, torch.arange(T).expand(2, -1))
    for h in hooks:
        h.remove()
    tap.close()
    for i, layer in tap.layers.items():
        mla, rec = layer.self_attn, tap.records[i]
        assert (rec.topk is None) == dense
        probs, _ = attention_probs(mla, rec)  # [B, H, T, S]
        with torch.no_grad():
            c_kv, _ = mla.project_kv(rec.x, rec.cos, rec.sin)
            v = mla.kv_b_proj(c_kv).view(2, T, mla.n_heads, -1)[..., mla.dn :]
            o = mla.o_proj(torch.einsum("bhts,bshd->bthd", probs, v).flatten(2))
        out = outputs[i]
        torch.testing.assert_close(o, out, rtol=1e-4, atol=1e-4 * float(out.abs().max()))
        p, _ = attention_target(mla, rec)
        torch.testing.assert_close(p.sum(-1), torch.ones(2, T))  # one distribution per query
        outside = p[:, :, :] * ~visible_keys(rec.q_idx, T, rec.topk, 2)
        assert not outside.any()  # no weight on future keys, nor (sparse) outside the selection
        if not dense:
            assert (p > 0).sum(-1).max() <= model.config.index_topk


def test_indexer_kl_is_the_kl_divergence():
    """indexer_kl against KL's definition, sum p log(p / q), over the visible keys of every query."""
    model = peaky_model()
    tap = LayerTap(model)
    ids = _ids(_seqs(2))
    real = torch.ones_like(ids, dtype=torch.bool)
    real[1, -5:] = False  # padding: these queries do not count
    with torch.no_grad(), dense_attention(model):
        model.model(ids, torch.arange(T).expand(2, -1))
        got = indexer_kl(model, tap, real)
    tap.close()
    want = []
    for i, layer in tap.layers.items():
        p, qr = attention_target(layer.self_attn, tap.records[i])
        logq = indexer_log_probs(layer.self_attn.indexer, tap.records[i], qr).detach()
        per_query = [
            sum(float(p[b, t, s]) * (float(p[b, t, s].log()) - float(logq[b, t, s])) for s in range(t + 1))
            for b in range(2)
            for t in range(T)
            if real[b, t]
        ]
        want.append(sum(per_query) / len(per_query))
    assert float(got) == pytest.approx(sum(want) / len(want), rel=1e-4)
    assert float(got) > 0.05  # the peaked attention is far from the random indexer's distribution


def test_dense_warmup_lowers_the_kl_and_leaves_the_main_model_bit_identical():
    model = peaky_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seqs = _seqs()
    hist = train_dense_warmup(model, seqs, DSAWarmupConfig(warmup_steps=12, warmup_lr=1e-2, batch_size=3))
    first, last = hist[0].lm, sum(h.lm for h in hist[-3:]) / 3
    assert last < 0.8 * first, [round(h.lm, 4) for h in hist]
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".indexer." in n for n in changed), sorted(changed)[:4]
    assert {n for n in before if ".indexer." in n} <= changed  # every indexer trains, the MTP layer's (3) too


def test_the_mtp_layers_indexer_learns_the_attention_it_drafts_with():
    """The warm-up runs the MTP layer's first draft step densely and fits its indexer to it: that layer's KL,
    alone, falls."""
    from finetune.dsa_warmup import LayerTap, indexer_kl, warmup_loss

    model = peaky_model()
    ids, _, real = next(iter(__import__("finetune.dsa_warmup", fromlist=["_batches"])._batches(
        _seqs(), DSAWarmupConfig(batch_size=3))))  # fmt: skip
    tap = LayerTap(model, mtp=True)
    mtp = model.config.num_hidden_layers
    assert mtp in tap.layers

    def mtp_kl() -> float:
        with torch.no_grad():
            warmup_loss(model, ids, real, tap)  # records every layer, the MTP layer's included
            for i in list(tap.records):
                if i != mtp:
                    tap.records.pop(i)
            assert tap.records[mtp].x.shape[1] == ids.shape[1] - 1
            return float(indexer_kl(model, tap, real))

    before = mtp_kl()
    tap.close()
    train_dense_warmup(model, _seqs(), DSAWarmupConfig(warmup_steps=12, warmup_lr=1e-2, batch_size=3))
    tap = LayerTap(model, mtp=True)
    after = mtp_kl()
    tap.close()
    assert after < 0.8 * before, (before, after)


def test_sparse_stage_each_loss_reaches_only_its_part():
    """The LM loss gives the indexers no gradient (their selection is indices, their input detached), and the
    indexers' KL gives the main model none: each is optimised only by its own loss."""
    model = peaky_model()
    for p in model.parameters():
        p.requires_grad_(True)
    tap = LayerTap(model)
    seqs = _seqs(2)
    ids = _ids(seqs)
    target = torch.zeros_like(ids, dtype=torch.bool)
    target[:, 4:] = True
    lm, kl = sparse_losses(model, ids, target, torch.ones_like(target), tap)
    tap.close()
    assert all(rec.topk is not None for rec in tap.records.values())  # the sparse path ran
    indexer = {n: p for n, p in model.named_parameters() if ".indexer." in n}
    main = {n: p for n, p in model.named_parameters() if ".indexer." not in n}
    lm.loss.backward(retain_graph=True)
    assert all(p.grad is None or not p.grad.any() for p in indexer.values())
    assert main["model.layers.0.self_attn.q_b_proj.weight"].grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    kl.backward()
    assert all(p.grad is None for p in main.values())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in indexer.items() if "layers.3." not in n)


def test_the_target_summed_by_chunks_of_heads_is_the_mean_over_all_heads(monkeypatch):
    import finetune.dsa_warmup as dw

    model = peaky_model()
    tap = LayerTap(model)
    with torch.no_grad():
        model.model(_ids(_seqs(2)), torch.arange(T).expand(2, -1))
    tap.close()
    mla, rec = tap.layers[0].self_attn, tap.records[0]
    whole = attention_probs(mla, rec)[0].mean(1)
    monkeypatch.setattr(dw, "_PROB_ELEMS", 3 * 2 * T * T)  # 3 heads a chunk: chunks of 3 and 1 of tiny's 4
    torch.testing.assert_close(attention_target(mla, rec)[0], whole, rtol=1e-6, atol=1e-7)
