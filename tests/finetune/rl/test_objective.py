"""The objective (finetune/rl/objective.py): GLM-5's direct double-sided IS keeps tokens whose ratio
pi_theta / pi_rollout lies in [1 - eps_l, 1 + eps_h], with gradient -A r grad log pi inside and none outside; IcePop
is the same rule on [1/beta, beta]; KL and mismatch statistics."""

from __future__ import annotations

import math

import pytest
import torch

from finetune.rl.config import RLConfig
from finetune.rl.objective import sample_loss


def test_tokens_outside_the_band_are_masked_and_get_no_gradient():
    band = RLConfig().band  # async default: double-sided IS
    assert band == pytest.approx((0.8, 1.28))
    rollout = torch.zeros(5)
    # ratios 0.5, 0.9, 1.0, 1.2, 1.5: the first and last are outside [0.8, 1.28]
    lp = torch.log(torch.tensor([0.5, 0.9, 1.0, 1.2, 1.5])).requires_grad_()
    loss, st = sample_loss(lp, rollout, advantage=2.0, band=band)
    loss.backward()
    assert st.masked == 2 and st.tokens == 5
    ratio = torch.tensor([0.5, 0.9, 1.0, 1.2, 1.5])
    expected = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]) * -2.0 * ratio / 5  # d(-(1/N) sum r A)/d lp = -A r / N
    torch.testing.assert_close(lp.grad, expected)
    assert float(loss.detach()) == pytest.approx(-2.0 * (0.9 + 1.0 + 1.2) / 5)


def test_icepop_is_the_on_policy_default_and_its_band_is_wider():
    assert RLConfig(sync=True).band == pytest.approx((0.5, 2.0))
    assert RLConfig(sync=True, objective="double-is").band == pytest.approx((0.8, 1.28))
    assert RLConfig(objective="icepop", icepop_beta=3).band == pytest.approx((1 / 3, 3))
    lp = torch.log(torch.tensor([0.6, 1.5]))
    _, st = sample_loss(lp, torch.zeros(2), 1.0, RLConfig(sync=True).band)
    assert st.masked == 0
    _, st = sample_loss(lp, torch.zeros(2), 1.0, RLConfig().band)
    assert st.masked == 2


def test_kl_and_mismatch_are_zero_on_policy_and_positive_off_it():
    lp = torch.tensor([-1.0, -2.0, -0.5])
    _, st = sample_loss(lp, lp.clone(), 1.0, (0.8, 1.28))
    assert st.kl == 0.0 and st.mismatch == 0.0
    _, st = sample_loss(lp, lp - 0.1, 1.0, (0.8, 1.28))
    assert st.mismatch == pytest.approx(0.3, rel=1e-5)
    assert st.kl == pytest.approx(3 * (math.exp(0.1) - 1 - 0.1), rel=1e-4) and st.kl > 0


def test_bad_bands_are_named():
    for kw, msg in (({"is_low": 1.0}, "is_low"), ({"icepop_beta": 1.0}, "icepop_beta"),
                    ({"objective": "ppo"}, "objective"), ({"max_staleness": -1}, "max_staleness")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            RLConfig(**kw)


def test_the_per_token_term_is_the_sum_and_the_per_sample_term_the_mean():
    lp = torch.log(torch.tensor([0.9, 1.0, 1.2, 1.5]))  # the last is outside the band: no term
    mean, _ = sample_loss(lp, torch.zeros(4), 2.0, (0.8, 1.28))
    total, _ = sample_loss(lp, torch.zeros(4), 2.0, (0.8, 1.28), per_token=True)
    assert float(total) == pytest.approx(-2.0 * (0.9 + 1.0 + 1.2)) and float(total) == pytest.approx(4 * float(mean))
    with pytest.raises(ValueError, match="loss_agg"):
        RLConfig(loss_agg="seq")
