"""The acceptance rule on synthetic distributions: exactness of speculative sampling, greedy equality, logprobs."""

from __future__ import annotations

import pytest
import torch

from serve.engine.rejection_sampler import accept_greedy, draft_tokens, processed_logprobs, rejection_sample, verify
from serve.engine.sampling_params import SamplingParams


def test_greedy_accepts_up_to_the_first_mismatch_then_adds_the_argmax():
    # argmax per row: 2, 0, 1, 3
    lp = torch.tensor([[0.0, 1, 5, 2], [9, 1, 0, 0], [0, 4, 1, 1], [0, 0, 0, 7]]).log_softmax(-1)
    assert accept_greedy(lp, [2, 0, 1]) == [2, 0, 1, 3]  # all accepted + bonus
    assert accept_greedy(lp, [2, 3, 1]) == [2, 0]  # second rejected: the target's own token instead
    assert accept_greedy(lp, [1, 0, 1]) == [2]
    assert accept_greedy(lp[:1], []) == [2]


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


@pytest.mark.parametrize("seed", [0, 1])
def test_emitted_tokens_follow_the_target_distribution_whatever_the_draft(seed):
    """First token ~ p_1; given draft 1 was accepted, the second ~ p_2 (speculation must not bias either)."""
    g = torch.Generator().manual_seed(seed)
    V, trials = 5, 12000
    p = (torch.randn(3, V, generator=g) * 1.5).softmax(-1)  # target rows p_1, p_2, p_3
    q = (torch.randn(2, V, generator=g) * 1.5).softmax(-1)  # draft distributions, deliberately different
    lp = p.log()
    first = torch.zeros(V)
    second = torch.zeros(V)
    n_accepted = 0
    for _ in range(trials):
        d1 = int(torch.multinomial(q[0], 1, generator=g))
        d2 = int(torch.multinomial(q[1], 1, generator=g))
        out = rejection_sample(lp, q, [d1, d2], g)
        assert 1 <= len(out) <= 3
        first[out[0]] += 1
        if len(out) > 1:
            n_accepted += 1
            second[out[1]] += 1
    assert _tv(first, p[0]) < 0.03, (first / trials, p[0])
    assert _tv(second, p[1]) < 0.04, (second / second.sum(), p[1])
    # Expected acceptance of draft 1 is sum_x min(p, q); the rule must achieve it.
    assert n_accepted / trials == pytest.approx(float(torch.minimum(p[0], q[0]).sum()), abs=0.02)


def test_identical_draft_and_target_always_accept():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(3, 7, generator=g).softmax(-1)
    for _ in range(50):
        drafts = [int(torch.multinomial(p[j], 1, generator=g)) for j in range(2)]
        assert rejection_sample(p.log(), p[:2], drafts, g)[:2] == drafts


def test_verify_reports_target_logprobs_and_top_n():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 11, generator=g)
    params = SamplingParams(temperature=0.7, top_k=5, logprobs=2)
    target = processed_logprobs(logits, params)
    drafts, qs = draft_tokens(logits[:2] + 0.3 * torch.randn(2, 11, generator=g), [params] * 2, [g, g])
    out = verify(logits, drafts, torch.stack(qs), params, g)
    for j, t in enumerate(out):
        assert t.logprob == pytest.approx(float(target[j, t.token_id]))
        assert list(t.top) == target[j].topk(2).indices.tolist()
        assert target[j, t.token_id] > float("-inf")  # never a token top-k removed
    greedy = verify(logits[:2], [int(logits[0].argmax())], None, SamplingParams(temperature=0), g)
    assert [t.token_id for t in greedy] == logits[:2].argmax(-1).tolist()
    assert greedy[0].logprob == pytest.approx(float(logits[0].log_softmax(-1).max()))
    with pytest.raises(ValueError, match="verification rows"):
        verify(logits, [1], None, SamplingParams(temperature=0), g)
