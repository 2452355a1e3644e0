"""The loop's micro-batches: the gradient of the whole batch (each micro-batch normalised by the batch's target
count), padded rows cut after their last target."""

from __future__ import annotations

import pytest
import torch

from finetune.mtp_objective import loss_denominators, mtp_loss
from finetune.sft import sft_loss
from finetune.train_loop import OptimConfig, backward_micro, make_optimizer, micro_batches
from model import GLM5ForCausalLM
from model.config import preset

torch.set_num_threads(1)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(a, b):
    assert a.keys() == b.keys() and a
    for n in a:
        scale = a[n].abs().max().clamp(min=1e-12)
        assert ((a[n] - b[n]).abs().max() / scale) < 1e-4, n


@pytest.mark.parametrize("objective", ["sft", "mtp"])
def test_micro_batches_give_the_whole_batchs_loss_and_gradient(objective):
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=2)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 24), generator=g)
    mask = torch.rand(3, 24, generator=g) > 0.4
    mask[1, 15:] = False  # a shorter (padded) row: cut after its last target
    if objective == "sft":
        whole = sft_loss(model, ids, mask)
        den = mask[:, 1:].sum()
        fn = lambda b: sft_loss(model, *b, denom=den)  # noqa: E731
    else:
        whole = mtp_loss(model, ids, 3, 0.3, mask)
        den = loss_denominators(ids, mask, 3)
        fn = lambda b: mtp_loss(model, b[0], 3, 0.3, b[1], denoms=den)  # noqa: E731
    whole.loss.backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    got = backward_micro((ids, mask), 1, fn)
    assert got.lm == pytest.approx(whole.lm, rel=1e-5) and got.mtp == pytest.approx(whole.mtp, rel=1e-5)
    _close(_grads(model), want)


def test_micro_batches_cut_rows_after_their_last_target():
    ids = torch.arange(12).view(2, 6)
    mask = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    (a_ids, a_mask), (b_ids, _) = micro_batches((ids, mask), 1)
    assert a_ids.tolist() == [[0, 1, 2]] and a_mask.tolist() == [[False, True, True]]
    assert b_ids.shape == (1, 6)
    assert [m.shape for m in micro_batches(ids, 1)] == [(1, 6), (1, 6)]  # no mask: whole rows


def test_the_fused_optimizer_makes_the_for_loops_updates():
    """make_optimizer's fused AdamW (one kernel over all tensors) against torch's plain for-loop AdamW: the same
    parameters after steps with weight decay and a warm-up, to fp32 rounding relative to the values' scale."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen) for s in [(16, 64), (64, 16), (300,), (5, 7, 3)]]
    cfg = OptimConfig(steps=6, lr=1e-2, warmup=2, weight_decay=0.1, grad_clip=0.0)
    fused = [t.clone().requires_grad_() for t in start]
    plain = [t.clone().requires_grad_() for t in start]
    opt = make_optimizer(fused, cfg)
    assert opt.defaults["fused"]
    ref = torch.optim.AdamW(plain, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), foreach=False)
    for step in range(cfg.steps):
        for o in (opt, ref):
            for g in o.param_groups:
                g["lr"] = cfg.lr_at(step)
        for a, b in zip(fused, plain, strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    for a, b, s in zip(fused, plain, start, strict=True):
        assert not torch.equal(a, s)  # it moved
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()


def test_strided_parameters_keep_the_for_loop():
    """The MoE's per-expert weights are strided views into their stacked tensor; fused AdamW updated them wrongly
    (full fine-tuning's loss after one step 5.97 instead of 5.65), so make_optimizer keeps the loop for them, and the
    update on such a view equals the plain for-loop's."""
    gen = torch.Generator().manual_seed(0)
    stacked = torch.randn(4, 8, 6, generator=gen)
    cfg = OptimConfig(steps=3, lr=1e-2, warmup=1, weight_decay=0.1, grad_clip=0.0)
    views = [stacked.clone().transpose(1, 2)[i] for i in range(4)]  # non-contiguous, as the experts' are
    params = [v.requires_grad_() for v in views]
    plain = [v.detach().clone().requires_grad_() for v in views]
    assert not params[0].is_contiguous()
    opt = make_optimizer(params, cfg)
    assert not opt.defaults["fused"]
    ref = torch.optim.AdamW(plain, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95), foreach=False)
    for _ in range(cfg.steps):
        for a, b in zip(params, plain, strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        opt.step()
        ref.step()
    for a, b in zip(params, plain, strict=True):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()
