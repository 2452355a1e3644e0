"""The LM + chained MTP loss: the formula, masks, gradients, and that training with it lowers every term."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from finetune.data.batches import token_batches
from finetune.mtp_objective import MTPTrainConfig, mtp_loss, train_mtp
from finetune.train_loop import OptimConfig
from model import GLM5ForCausalLM
from model.config import preset

torch.set_num_threads(1)


def _model(seed: int = 0) -> GLM5ForCausalLM:
    return GLM5ForCausalLM.from_config(preset("tiny"), seed=seed)


def test_terms_are_the_chained_formula():
    model = _model().eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    out = mtp_loss(model, ids, num_steps=3, mtp_weight=0.5)
    with torch.no_grad():
        logits, h = model(ids, return_hidden=True)
        lm = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        steps = []
        for k in range(3):
            # step k: hidden at t (from step k-1), token t+1+k at position t+1+k -> predicts token t+2+k
            n = 20 - 1 - k
            d, h = model.mtp_forward(h[:, :n], ids[:, 1 + k :], torch.arange(1 + k, 20), step=k)
            assert d.shape == (2, n, model.config.vocab_size)
            steps.append(F.cross_entropy(d[:, :-1].flatten(0, 1), ids[:, 2 + k :].flatten()))
    assert out.lm == pytest.approx(lm.item(), rel=1e-5)
    assert out.mtp == pytest.approx([s.item() for s in steps], rel=1e-5)
    assert out.loss.item() == pytest.approx(lm.item() + 0.5 * sum(s.item() for s in steps) / 3, rel=1e-5)
    # Different steps see different inputs, so their losses differ: the chain is not one step repeated.
    assert len(set(round(x, 6) for x in out.mtp)) == 3


def test_loss_mask_selects_targets_of_every_term():
    model = _model().eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(1, 16, dtype=torch.bool)
    mask[0, 10:] = True  # only the "assistant" tail is trained
    out = mtp_loss(model, ids, num_steps=2, loss_mask=mask)
    with torch.no_grad():
        logits, h = model(ids, return_hidden=True)
        lm = F.cross_entropy(logits[0, 9:-1], ids[0, 10:])
        d, _ = model.mtp_forward(h[:, :15], ids[:, 1:], torch.arange(1, 16))
        step0 = F.cross_entropy(d[0, 8:14], ids[0, 10:])  # d[t] predicts token t+2
    assert out.lm == pytest.approx(lm.item(), rel=1e-5)
    assert out.mtp[0] == pytest.approx(step0.item(), rel=1e-5)
    with pytest.raises(ValueError, match="loss_mask shape"):
        mtp_loss(model, ids, loss_mask=mask[:, :-1])


def test_gradients_reach_the_mtp_layer_and_train_main_false_leaves_the_trunk_alone():
    model = _model()
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2))
    mtp_loss(model, ids).loss.backward()
    L = model.config.num_hidden_layers
    for name in (
        "eh_proj.weight",
        "enorm.weight",
        "hnorm.weight",
        "shared_head.norm.weight",
        "self_attn.q_a_proj.weight",
    ):
        g = model.get_parameter(f"model.layers.{L}.{name}").grad
        assert g is not None and g.abs().sum() > 0, name
    assert model.get_parameter("model.layers.0.self_attn.q_a_proj.weight").grad.abs().sum() > 0

    model.zero_grad(set_to_none=True)
    out = mtp_loss(model, ids, train_main=False)
    out.loss.backward()
    assert model.get_parameter("model.layers.0.self_attn.q_a_proj.weight").grad is None
    assert model.get_parameter(f"model.layers.{L}.eh_proj.weight").grad.abs().sum() > 0
    # The shared lm_head and embedding get gradient through the MTP path, like the MTP layer itself.
    assert model.lm_head.weight.grad is not None


def test_bad_input_is_named():
    model = _model()
    with pytest.raises(ValueError, match="too short"):
        mtp_loss(model, torch.zeros(1, 4, dtype=torch.long), num_steps=3)
    with pytest.raises(ValueError, match=r"\[batch, tokens\]"):
        mtp_loss(model, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="no MTP layer"):
        mtp_loss(
            GLM5ForCausalLM(preset("tiny").replace(num_nextn_predict_layers=0)), torch.zeros(1, 8, dtype=torch.long)
        )


def test_training_loop_lowers_lm_and_every_mtp_step():
    torch.manual_seed(0)
    model = _model()
    # A repetitive stream (a short "program" repeated with variations) that a tiny model can learn quickly.
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(0, 200, (12,), generator=g).tolist()
    stream = []
    for i in range(60):
        stream += motif + [200 + i % 5]
    cfg = MTPTrainConfig(OptimConfig(steps=25, lr=1e-2, warmup=3))
    hist = train_mtp(model, token_batches(stream, seq_len=16, batch_size=2), cfg)
    assert len(hist) == 25 and not model.training
    first, last = hist[0], hist[-1]
    assert last.lm < first.lm / 2
    for k in range(3):
        assert last.mtp[k] < first.mtp[k] / 2, (k, first.mtp, last.mtp)


def test_train_main_false_updates_only_the_mtp_layer():
    model = _model()
    L = model.config.num_hidden_layers
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stream = torch.randint(0, 300, (400,), generator=torch.Generator().manual_seed(4)).tolist()
    cfg = MTPTrainConfig(OptimConfig(steps=2, lr=1e-2, warmup=1), train_main=False)
    hist = train_mtp(model, token_batches(stream, seq_len=12, batch_size=2), cfg)
    assert all(h.loss.item() == pytest.approx(sum(h.mtp) / 3, rel=1e-5) for h in hist)  # the MTP loss alone
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(f"model.layers.{L}.") for n in changed), sorted(changed)[:5]
    # The rest was frozen for the loop (no gradient computed for the shared lm_head) and is trainable again.
    assert model.lm_head.weight.grad is None and model.model.embed_tokens.weight.grad is None
    assert all(p.requires_grad for p in model.parameters())


def test_sft_loss_mtp_term_is_mtp_loss_with_the_same_mask():
    """SFT's MTP term (finetune/sft.py, target rows only through the lm_head) against mtp_objective's plain
    full-logits path: the same LM and per-step losses, and the same total, for a masked batch."""
    from finetune.sft import sft_loss

    model = _model(1).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=g)
    mask = torch.rand(2, 24, generator=g) > 0.4
    with torch.no_grad():
        ref = mtp_loss(model, ids, num_steps=3, mtp_weight=0.3, loss_mask=mask)
        got = sft_loss(model, ids, mask, mtp_steps=3, mtp_weight=0.3)
        no_mtp = sft_loss(model, ids, mask)
    assert got.lm == pytest.approx(ref.lm, rel=1e-5)
    assert got.mtp == pytest.approx(ref.mtp, rel=1e-5) and len(got.mtp) == 3
    assert float(got.loss) == pytest.approx(float(ref.loss), rel=1e-5)
    assert no_mtp.mtp == [] and float(no_mtp.loss) == pytest.approx(ref.lm, rel=1e-5)


def test_packed_sft_mtp_term_never_crosses_a_sequence_boundary():
    """Two sequences packed into one row give the MTP terms' sums of the two run alone: no draft attends to, or
    is trained on, the other sequence."""
    from finetune.data.packing import packed_row
    from finetune.sft import sft_loss

    model = _model(2).eval()
    g = torch.Generator().manual_seed(4)
    seqs = [(torch.randint(0, 1000, (n,), generator=g).tolist(), [True] * n) for n in (11, 9)]
    ones = [torch.tensor(1.0)] * 2
    with torch.no_grad():
        alone = [sft_loss(model, torch.tensor([s]), torch.tensor([[False] + m[1:]]), denom=1, mtp_steps=2,
                          mtp_denoms=ones) for s, m in seqs]  # fmt: skip
        ids, mask, pos, seg = (x[None] for x in packed_row(seqs, 24))
        packed = sft_loss(model, ids, mask, pos, seg, denom=1, mtp_steps=2, mtp_denoms=ones)
    assert packed.lm == pytest.approx(sum(a.lm for a in alone), rel=1e-4)
    for k in range(2):
        assert packed.mtp[k] == pytest.approx(sum(a.mtp[k] for a in alone), rel=1e-4)
