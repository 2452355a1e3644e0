"""The trainer (finetune/rl/trainer.py) on `tiny`: one optimizer step per batch, weighted by group advantages over
exactly the sampled tokens; a batch without signal changes nothing; the optimizer reset empties AdamW's state."""

from __future__ import annotations

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
