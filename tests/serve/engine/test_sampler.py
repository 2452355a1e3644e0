"""Sampler without a model: greedy, filters, penalties, per-request seeds, exact logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from serve.engine.sampler import Sampler, filter_logits
from serve.engine.sampling_params import SamplingParams
from serve.engine.sequence import Sequence

V = 10


def seq(rid="r", prompt=(1, 2, 3), out=(), **kw):
    s = Sequence(rid, list(prompt), SamplingParams(**kw))
    s.token_ids += list(out)
    return s


def logits(*rows):
    return torch.tensor(rows, dtype=torch.float32)


ROW = [0.5, 3.0, 1.0, -2.0, 2.5, 0.0, -1.0, 1.5, 0.2, -0.3]


def test_greedy_takes_argmax_and_logprob_is_log_softmax():
    out = Sampler()(logits(ROW), [seq(temperature=0.0, logprobs=3)])[0]
    ref = torch.tensor(ROW).log_softmax(-1)
    assert out.token_id == 1
    assert out.logprob == pytest.approx(ref[1].item(), abs=1e-6)
    assert list(out.top) == [1, 4, 7]
    assert out.top[4] == pytest.approx(ref[4].item(), abs=1e-6)


def test_temperature_logprob_is_of_the_tempered_distribution():
    out = Sampler()(logits(ROW), [seq(temperature=0.5, seed=3)])[0]
    ref = (torch.tensor(ROW) / 0.5).log_softmax(-1)
    assert out.logprob == pytest.approx(ref[out.token_id].item(), abs=1e-6)


def test_top_k_top_p_min_p_drop_tokens_and_renormalise():
    row = torch.tensor([ROW])
    k = filter_logits(row, torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert torch.isfinite(k[0]).nonzero().flatten().tolist() == [1, 4]
    probs = torch.tensor(ROW).softmax(-1)
    p = filter_logits(row, torch.tensor([0]), torch.tensor([0.5]), torch.tensor([0.0]))
    # token 1 alone has < 0.5 of the mass, so top-p 0.5 keeps tokens 1 and 4.
    assert probs[1] < 0.5 < probs[1] + probs[4]
    assert torch.isfinite(p[0]).nonzero().flatten().tolist() == [1, 4]
    m = filter_logits(row, torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.3]))
    keep = (probs >= 0.3 * probs.max()).nonzero().flatten().tolist()
    assert torch.isfinite(m[0]).nonzero().flatten().tolist() == keep
    # Sampling with top_k=2 only ever gives tokens 1 or 4, and their logprobs sum to log(1).
    s = seq(temperature=1.0, top_k=2, seed=0, logprobs=5)
    outs = [Sampler()(logits(ROW), [s])[0] for _ in range(50)]
    assert {o.token_id for o in outs} == {1, 4}
    assert math.fsum(math.exp(v) for v in outs[0].top.values()) == pytest.approx(1.0, abs=1e-6)
    assert len(outs[0].top) == 2  # -inf alternatives are not reported


def test_sampling_follows_the_distribution():
    s = seq(temperature=1.0, seed=1)
    counts = torch.zeros(V)
    for _ in range(2000):
        counts[Sampler()(logits(ROW), [s])[0].token_id] += 1
    probs = torch.tensor(ROW).softmax(-1)
    assert torch.allclose(counts / 2000, probs, atol=0.04)


def test_same_seed_same_tokens_whatever_else_is_in_the_batch():
    def draw(batch_mates):
        s = seq("mine", temperature=0.9, top_p=0.9, seed=1234)
        toks = []
        for step in range(20):
            others = [seq(f"o{i}", temperature=1.0, seed=step * 10 + i) for i in range(batch_mates)]
            rows = logits(*([ROW] * (batch_mates + 1)))
            out = Sampler()(rows, others + [s])
            toks.append(out[-1].token_id)
        return toks

    alone, crowded = draw(0), draw(3)
    assert alone == crowded
    assert len(set(alone)) > 1  # it really samples


def test_different_seeds_differ():
    a = [Sampler()(logits(ROW), [seq(temperature=1.0, seed=1)])[0].token_id for _ in range(1)]
    s1, s2 = seq(temperature=1.0, seed=1), seq(temperature=1.0, seed=2)
    t1 = [Sampler()(logits(ROW), [s1])[0].token_id for _ in range(30)]
    t2 = [Sampler()(logits(ROW), [s2])[0].token_id for _ in range(30)]
    assert t1 != t2 and a[0] == t1[0]


def test_repetition_penalty_matches_hf_semantics():
    s = seq(prompt=(1,), out=(3,), temperature=0.0, repetition_penalty=2.0, logprobs=V)
    out = Sampler()(logits(ROW), [s])[0]
    ref = torch.tensor(ROW)
    ref[1] = ref[1] / 2.0  # positive: divided
    ref[3] = ref[3] * 2.0  # negative: multiplied
    assert out.token_id == 4  # 3.0 / 2 = 1.5 < 2.5
    for t, v in out.top.items():
        assert v == pytest.approx(ref.log_softmax(-1)[t].item(), abs=1e-6)


def test_presence_and_frequency_penalties_use_output_counts():
    s = seq(prompt=(4,), out=(1, 1, 7), temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25, logprobs=V)
    out = Sampler()(logits(ROW), [s])[0]
    ref = torch.tensor(ROW)
    ref[1] -= 0.5 + 0.25 * 2
    ref[7] -= 0.5 + 0.25
    assert out.token_id == 4  # the prompt token is not penalised
    assert out.top[1] == pytest.approx(ref.log_softmax(-1)[1].item(), abs=1e-6)


def test_mixed_batch_greedy_and_sampled_rows():
    rows = logits(ROW, ROW[::-1])
    out = Sampler()(rows, [seq("g", temperature=0.0), seq("s", temperature=1.0, top_k=1, seed=5)])
    assert out[0].token_id == 1 and out[1].token_id == V - 1 - 1


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"stop": [""]}, "stop strings"),
    ],
)
def test_bad_params_are_rejected_with_their_name(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw)


def test_stop_accepts_a_single_string():
    assert SamplingParams(stop="END").stop == ("END",)


def test_a_tiny_temperature_samples_greedily_instead_of_giving_nan():
    greedy = Sampler()(logits(ROW), [seq(temperature=0.0, logprobs=3)])[0]
    for t in (1e-300, 1e-6):  # 1e-300 is 0 in float32: dividing by it gave NaN logprobs and token 0
        out = Sampler()(logits(ROW), [seq(temperature=t, seed=1, logprobs=3)])[0]
        assert out == greedy and math.isfinite(out.logprob)
