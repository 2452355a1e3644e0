"""The trainer (finetune/rl/trainer.py) on `tiny`: one optimizer step per batch, weighted by group advantages over
exactly the sampled tokens; a batch without signal changes nothing; the optimizer reset empties AdamW's state."""

from __future__ import annotations

import pytest
import torch

from finetune.rl.config import RLConfig
from finetune.rl.rollout import Rollout, TokenSample
from finetune.rl.trainer import Trainer
from tests.finetune.rl.conftest import peaky_model


def _sample(model, prompt, out):
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + out]))[0].float(), -1)
    lps = [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]
    return TokenSample(prompt + out, [0] * len(prompt) + [1] * len(out), [0.0] * len(prompt) + lps, 0)


def _group(model, rewards):
    prompt = [5, 6, 7, 8]
    return [
        Rollout(0, i, 0, reward=r, samples=[_sample(model, prompt, [11 + i, 12, 13])]) for i, r in enumerate(rewards)
    ]


def test_a_step_moves_the_rewarded_tokens_up_and_counts_versions():
    model = peaky_model()
    tr = Trainer(model, RLConfig(group_size=2, lr=1e-2))
    group = _group(model, [1.0, 0.0])
    before = [sum(s.logprobs) for r in group for s in r.samples]
    st = tr.step([group])
    after = [sum(_sample(model, [5, 6, 7, 8], s.ids[4:]).logprobs) for r in group for s in r.samples]
    assert after[0] > before[0] and after[1] < before[1]
    assert st["groups_with_signal"] == 1 and st["pg_grad_norm"] > 0 and st["is_masked"] == 0.0
    assert st["mismatch"] < 1e-4 and tr.version == 1
    assert len(tr.opt.state) > 0
    tr.reset_optimizer()
    assert len(tr.opt.state) == 0


def test_a_batch_without_signal_changes_nothing():
    model = peaky_model()
    tr = Trainer(model, RLConfig(group_size=2))
    before = {n: p.detach().clone() for n, p in tr.named}
    st = tr.step([_group(model, [1.0, 1.0])])
    assert st["groups_with_signal"] == 0 and st["pg_grad_norm"] == 0.0 and tr.version == 1
    assert all(torch.equal(before[n], p) for n, p in tr.named)


def test_the_token_level_loss_weighs_every_token_alike_and_the_sample_level_one_every_sample():
    """Two sessions of 1 and 4 sampled tokens, on-policy (r = 1): sample gives -(1/G) sum_i A_i/|y_i| grad sum_t
    log pi; token gives -(1/sum |y|) sum_i A_i grad sum_t log pi (DAPO). The trainer's gradient is each."""
    from finetune.grpo import advantages
    from finetune.rl.objective import token_logprobs

    prompt = [5, 6, 7, 8]
    grads = {}
    for agg in ("sample", "token"):
        model = peaky_model()
        cfg = RLConfig(group_size=2, lr=1e-9, max_grad_norm=1e9, loss_agg=agg)
        tr = Trainer(model, cfg)
        group = [Rollout(0, 0, 0, reward=1.0, samples=[_sample(model, prompt, [11])]),
                 Rollout(0, 1, 0, reward=0.0, samples=[_sample(model, prompt, [12, 13, 14, 15])])]  # fmt: skip
        a = advantages([1.0, 0.0])
        per_sample = []
        for r in group:
            tr.opt.zero_grad(set_to_none=True)
            token_logprobs(model, r.samples, cfg.temperature)[0].sum().backward()
            per_sample.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in tr.params])
        if agg == "sample":
            want = [-(a[0] / 1 * g0 + a[1] / 4 * g1) / 2 for g0, g1 in zip(*per_sample, strict=True)]
        else:
            want = [-(a[0] * g0 + a[1] * g1) / 5 for g0, g1 in zip(*per_sample, strict=True)]
        tr.step([group])
        got = [torch.zeros_like(p) if p.grad is None else p.grad for p in tr.params]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4 * float(w.abs().max()) + 1e-9)
        grads[agg] = torch.cat([g.flatten() for g in got])
    assert grads["token"].abs().sum() > 0
    assert not torch.allclose(grads["sample"], grads["token"])


def test_the_refusal_penalty_pushes_down_only_the_refused_calls_tokens_even_in_a_group_without_signal():
    """--refusal-penalty P: a refused call's tokens get advantage min(A, 0) - P, the rest of the sample A. In a group
    whose rewards are equal (A = 0) the refused tokens still get -P and nothing else moves; without the penalty
    that group trains nothing."""
    from finetune.rl.trainer import token_advantages

    prompt = [5, 6, 7, 8]
    s = TokenSample([*prompt, 11, 12, 9, 13, 14], [0, 0, 0, 0, 1, 1, 0, 1, 1], [0.0] * 9, 0, refused=[[7, 9]])
    assert token_advantages(s, 0.5, 0.0) == 0.5
    assert token_advantages(s, 0.5, 2.0).tolist() == [0.5, 0.5, -2.0, -2.0]  # sampled tokens 11, 12 | 13, 14
    assert token_advantages(s, -0.5, 2.0).tolist() == [-0.5, -0.5, -2.5, -2.5]
    with pytest.raises(ValueError, match="refusal_penalty"):
        RLConfig(refusal_penalty=-1.0)

    def run(penalty):
        model = peaky_model()
        tr = Trainer(model, RLConfig(group_size=2, lr=1e-2, refusal_penalty=penalty))
        refused = _sample(model, prompt, [11, 12, 13])
        refused.refused = [[6, 7]]  # the call that sampled token 13
        group = [Rollout(0, 0, 0, reward=1.0, samples=[refused]),
                 Rollout(0, 1, 0, reward=1.0, samples=[_sample(model, prompt, [11, 12, 14])])]  # fmt: skip
        st = tr.step([group])
        after = _sample(model, prompt, [11, 12, 13]).logprobs
        return st, refused.logprobs, after

    st, before, after = run(0.0)
    assert st["pg_grad_norm"] == 0.0 and after == before
    st, before, after = run(1.0)
    assert st["groups_with_signal"] == 0 and st["pg_grad_norm"] > 0
    assert after[-1] < before[-1]  # the refused token went down


def test_negative_weight_0_trains_only_the_sessions_that_beat_their_group():
    """--negative-weight 0 (rejection sampling on the policy's own sessions): the failed session adds no term, the
    solved one is pulled up as GRPO would; 1 is GRPO (both trained)."""
    tokens = {}
    for w in (0.0, 1.0):
        model = peaky_model()
        tr = Trainer(model, RLConfig(group_size=2, lr=1e-2, negative_weight=w))
        group = _group(model, [1.0, 0.0])
        before = sum(group[0].samples[0].logprobs)
        st = tr.step([group])
        assert sum(_sample(model, [5, 6, 7, 8], group[0].samples[0].ids[4:]).logprobs) > before
        tokens[w] = st["train_tokens"]
    assert tokens[0.0] == 7 and tokens[1.0] == 14  # one sample of 4 prompt + 3 sampled ids, or both
    with pytest.raises(ValueError, match="negative_weight"):
        RLConfig(negative_weight=1.5)
