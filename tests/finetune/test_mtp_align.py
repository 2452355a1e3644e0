"""Aligning the MTP layer with its main model: the self-distillation loss, the data it trains on, and that it
raises acceptance in the engine while leaving the main model, and so every output, exactly as it was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from finetune.data.batches import padded_batches, token_batches
from finetune.mtp_align import align_mtp, default_draft_vocab_size, draft_vocab, generate_sequences
from finetune.mtp_objective import MTPTrainConfig, mtp_loss, train_mtp
from finetune.train_loop import OptimConfig
from model import GLM5ForCausalLM
from model.config import preset
from serve.engine import EngineConfig, LLMEngine, SamplingParams

torch.set_num_threads(1)


def _model(seed: int = 0) -> GLM5ForCausalLM:
    return GLM5ForCausalLM.from_config(preset("tiny"), seed=seed).eval()


def test_model_targets_are_the_kl_to_the_main_models_own_distribution():
    model = _model()
    ids = torch.randint(0, model.config.vocab_size, (2, 18), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :9] = False
    out = mtp_loss(model, ids, num_steps=2, loss_mask=mask, train_main=False, targets="model")
    with torch.no_grad():
        logits, h = model(ids, return_hidden=True)
        teacher = F.log_softmax(logits, -1)
        want = []
        for k in range(2):
            n = 18 - 1 - k
            d, h = model.mtp_forward(h[:, :n], ids[:, 1 + k :], torch.arange(1 + k, 18), step=k)
            # d[:, t] drafts token t+2+k; the main model's guess of that token is teacher[:, t+1+k].
            p, logq = teacher[:, 1 + k : 17], F.log_softmax(d[:, :-1], -1)
            kl = (p.exp() * (p - logq)).sum(-1)
            m = mask[:, 2 + k :].float()
            want.append(((kl * m).sum() / m.sum()).item())
    assert out.mtp == pytest.approx(want, rel=1e-5)
    assert all(x > 0 for x in out.mtp)
    assert out.loss.item() == pytest.approx(sum(want) / 2, rel=1e-5)
    with pytest.raises(ValueError, match="targets must be"):
        mtp_loss(model, ids, targets="text")


def test_padded_batches_mark_only_generated_tokens_and_name_bad_data():
    seqs = [([1, 2, 3, 4, 5, 6], 2), ([7, 8, 9, 10], 3), ([11, 12, 13, 14, 15], 4)]
    ids, mask = next(padded_batches(seqs, batch_size=3, min_len=4))
    assert ids.shape == mask.shape == (3, 6)
    for s, p in seqs:
        r = next(i for i in range(3) if ids[i, : len(s)].tolist() == s)
        assert mask[r].tolist() == [False] * p + [True] * (len(s) - p) + [False] * (6 - len(s))
        assert ids[r, len(s) :].tolist() == [0] * (6 - len(s))  # padding after every real token
    # Batches keep coming (reshuffled), and a batch never holds the same sequence twice.
    it = padded_batches(seqs, batch_size=2, min_len=4, seed=1)
    for _ in range(5):
        b, _ = next(it)
        assert b.shape[0] == 2 and not torch.equal(b[0], b[1])
    with pytest.raises(ValueError, match="no sequence has 8 tokens"):
        next(padded_batches(seqs, batch_size=2, min_len=8))
    with pytest.raises(ValueError, match="generated part"):
        next(padded_batches([([1, 2, 3, 4, 5], 5)], batch_size=1, min_len=4))


def test_train_mtp_takes_id_and_mask_batches():
    model = _model()
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 8:] = True
    cfg = MTPTrainConfig(OptimConfig(steps=1, lr=1e-3, warmup=1), train_main=False)
    got = train_mtp(model, iter([(ids, mask)]), cfg)[0]
    want = mtp_loss(_model(), ids, loss_mask=mask, train_main=False)
    assert got.mtp == pytest.approx(want.mtp, rel=1e-5)


def _acceptance(model, prompts, k=3, new_tokens=24) -> tuple[float, list[list[int]]]:
    eng = LLMEngine(model, config=EngineConfig(num_kv_blocks=128, block_size=16, speculative="mtp", num_draft_tokens=k))
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    ids = [eng.add_request(p, params) for p in prompts]
    done = {}
    while eng.has_unfinished:
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.token_ids
    return eng.runner.spec_metrics.mean_acceptance_length, [done[i] for i in ids]


def test_aligning_raises_acceptance_and_changes_no_output():
    torch.manual_seed(0)
    model = _model(seed=3)
    # A main model that has learnt something (a motif stream), with an MTP layer that has learnt nothing.
    g = torch.Generator().manual_seed(5)
    motif = torch.randint(0, 200, (12,), generator=g).tolist()
    stream = [t for i in range(60) for t in motif + [200 + i % 5]]
    train_mtp(
        model,
        token_batches(stream, seq_len=16, batch_size=4),
        MTPTrainConfig(OptimConfig(steps=30, lr=1e-2), num_mtp_steps=0),
    )
    starts = torch.randint(0, len(stream) - 20, (24,), generator=g).tolist()
    prompts = [stream[s : s + 6 + s % 7] for s in starts]
    mtp = f"model.layers.{model.config.num_hidden_layers}."
    main_before = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith(mtp)}
    held = prompts[:4]
    acc_before, out_before = _acceptance(model, held)

    calls = []
    seqs = generate_sequences(
        model, prompts[4:], max_new_tokens=32, ignore_eos=True, progress=lambda d, t: calls.append(d)
    )
    assert calls == list(range(1, 21))
    assert all(
        len(s) == len(p) + 32 and s[: len(p)] == p and n == len(p) for (s, n), p in zip(seqs, prompts[4:], strict=True)
    )
    cfg = MTPTrainConfig(OptimConfig(steps=40, lr=3e-3, warmup=4), train_main=False)
    hist = align_mtp(model, seqs, cfg, batch_size=8)
    assert hist[-1].mtp_mean < hist[0].mtp_mean / 2

    acc_after, out_after = _acceptance(model, held)
    assert out_after == out_before  # the main model decides every token: outputs are bit-identical
    assert acc_after > acc_before + 0.5, (acc_before, acc_after)
    for n, p in model.named_parameters():
        if n in main_before:
            assert torch.equal(p, main_before[n]), n


def test_generate_sequences_names_bad_prompts():
    model = _model()
    with pytest.raises(ValueError, match="no prompts"):
        generate_sequences(model, [], 4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate_sequences(model, [[1, 2], []], 4)


def test_draft_vocab_ranks_generated_tokens_and_fills_from_a_fallback():
    seqs = [([9, 9, 1, 1, 1, 2], 2), ([8, 1, 3, 3], 1)]  # generated: 1 x4, 2 x1, 3 x2
    assert draft_vocab(seqs, coverage=0.5) == [1]
    assert draft_vocab(seqs, coverage=0.8) == [1, 3]
    assert draft_vocab(seqs) == [1, 2, 3]
    assert draft_vocab(seqs, size=2) == [1, 3]
    # More than the model generated: the most frequent tokens of the fallback stream fill the rest.
    assert draft_vocab(seqs, size=5, fallback=[7, 7, 7, 5, 5, 1, 4]) == [1, 2, 3, 5, 7]
    with pytest.raises(ValueError, match="no generated tokens"):
        draft_vocab([([1, 2], 2)])
    with pytest.raises(ValueError, match="coverage"):
        draft_vocab(seqs, coverage=0)


def test_default_draft_vocab_size_grows_with_what_the_model_says():
    narrow = [([0] + [t % 10 for t in range(500)], 1)]  # 10 distinct tokens
    assert default_draft_vocab_size(narrow, 8192) == 512  # V/16
    broad = [([0] + list(range(2000)) * 2, 1)]  # 2000 tokens, equally often: 99.9% needs 1998 of them
    assert default_draft_vocab_size(broad, 8192) == 1998
    assert default_draft_vocab_size(broad, 1024) == 1024  # never past the vocabulary
