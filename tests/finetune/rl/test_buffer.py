"""The rollout buffer (finetune/rl/buffer.py): the staleness drop, the crash-group rule (pad if more than half is
valid, else drop), the reasons reported, and rollouts on disk that a resumed run reloads."""

from __future__ import annotations

import pytest

from finetune.rl.buffer import RolloutBuffer, apply_rules
from finetune.rl.rollout import ENV_ERROR, ModelCall, Rollout, TokenSample


def roll(group, index, reward=1.0, versions=(5,), status="ok"):
    calls = [ModelCall([1, 2], [3], [-0.5], v, v) for v in versions]
    return Rollout(group, index, 0, status=status, reward=None if status != "ok" else reward, calls=calls,
                   samples=[TokenSample([1, 2, 3], [0, 0, 1], [0.0, 0.0, -0.5], min(versions))])  # fmt: skip


def test_a_sample_whose_oldest_call_lags_more_than_tau_is_dropped():
    group = [roll(0, 0, versions=(2, 5)), roll(0, 1, versions=(5,)), roll(0, 2, versions=(4, 5)), roll(0, 3)]
    kept, why, counts = apply_rules(group, version=5, tau=2, size=4)
    # lags 3 (oldest call at 2), 0, 1, 0: one stale sample, and 3 of 4 valid is more than half -> padded
    assert counts["stale"] == 1 and why == ""
    assert [(r.index) for r in kept] == [1, 2, 3, 1]
    kept, _, counts = apply_rules(group, version=5, tau=3, size=4)
    assert counts["stale"] == 0 and [r.index for r in kept] == [0, 1, 2, 3]
    kept, why, _ = apply_rules(group, version=8, tau=0, size=4)  # everything is stale
    assert kept is None and why.startswith("stale: 0/4 valid")


def test_crashed_groups_are_padded_above_half_valid_and_dropped_otherwise():
    crash = lambda i: roll(0, i, status=ENV_ERROR)  # noqa: E731
    kept, why, counts = apply_rules([roll(0, 0, 1.0), crash(1), roll(0, 2, 0.0), roll(0, 3, 1.0)], 5, 2, 4)
    assert why == "" and counts["crashed"] == 1
    assert [r.index for r in kept] == [0, 2, 3, 0] and [r.reward for r in kept] == [1.0, 0.0, 1.0, 1.0]
    kept, why, _ = apply_rules([roll(0, 0), crash(1), crash(2), roll(0, 3)], 5, 2, 4)  # exactly half: dropped
    assert kept is None and why == "crashed: 2/4 valid (0 stale, 2 crashed)"
    no_reward = roll(0, 1)
    no_reward.reward = None  # a grader that gave no reward is not a valid sample either
    kept, why, _ = apply_rules([roll(0, 0), no_reward, roll(0, 2), roll(0, 3)], 5, 2, 4)
    assert [r.index for r in kept] == [0, 2, 3, 0]


def test_take_returns_the_lowest_complete_groups_and_reports_drops(tmp_path):
    buf = RolloutBuffer(tmp_path, group_size=2, tau=1)
    for g in (3, 1, 0, 2):
        for i in range(2):
            st = ENV_ERROR if g == 1 else "ok"
            buf.add(roll(g, i, reward=float(i), versions=(4,), status=st))
    buf.add(roll(7, 0))  # group 7 is incomplete
    groups, rep = buf.take(version=5, n=2)
    assert [g[0].group for g in groups] == [0, 2] and rep.kept == [0, 2]
    assert rep.dropped == {1: "crashed: 0/2 valid (0 stale, 2 crashed)"} and rep.dropped_by_reason() == {"crashed": 1}
    assert dict(rep.lags) == {1: 4}  # four distinct samples, each one version behind
    assert not (tmp_path / "g1-s0.json").exists()  # a dropped group leaves the buffer (and the disk)
    buf.forget(rep.kept)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["g3-s0.json", "g3-s1.json", "g7-s0.json"]


def test_dynamic_sampling_drops_no_signal_groups_up_to_its_limit(tmp_path):
    buf = RolloutBuffer(tmp_path, group_size=2, tau=1)
    for g, rewards in enumerate([(1.0, 1.0), (0.0, 1.0), (0.0, 0.0), (1.0, 0.0)]):
        for i, r in enumerate(rewards):
            buf.add(roll(g, i, reward=r))
    groups, rep = buf.take(version=5, n=2, filter_uniform=1)
    # group 0 (all 1.0) is dropped; group 2 (all 0.0) is the second no-signal group, past the limit: kept
    assert rep.kept == [1, 2] and rep.dropped == {0: "no_signal: all 2 rewards 1"}
    assert rep.dropped_by_reason() == {"no_signal": 1} and sorted(r.index for r in rep.uniform) == [0, 1]
    assert [[r.reward for r in g] for g in groups] == [[0.0, 1.0], [0.0, 0.0]]
    assert not (tmp_path / "g0-s0.json").exists()
    _, rep = RolloutBuffer(None, group_size=2, tau=1).take(5, 0)  # off by default: nothing filtered
    assert rep.uniform == [] and rep.dropped == {}


def test_a_new_buffer_reloads_what_a_killed_run_finished(tmp_path):
    buf = RolloutBuffer(tmp_path, group_size=2, tau=1)
    for g in range(3):
        for i in range(2):
            buf.add(roll(g, i, reward=float(i)))
    (tmp_path / "g9-s0.tmp").write_text("{half a file")  # a kill mid-write leaves only a .tmp
    again = RolloutBuffer(tmp_path, group_size=2, tau=1)
    assert again.load(consumed={0}) == 4
    assert again.complete() == [1, 2] and again.has(1, 1) and not again.has(0, 0)
    r = again.groups[2][1]
    assert r.reward == 1.0 and r.samples[0].mask == [0, 0, 1] and r.calls[0].version_start == 5
    assert not (tmp_path / "g0-s0.json").exists()  # consumed before the kill: gone
    # Judged again against the resumed trainer's version: 2 versions behind > tau = 1, so both groups go.
    seen = {}

    class Empty(Exception):
        pass

    def wait(rep):
        seen.update(rep.dropped)
        raise Empty

    with pytest.raises(Empty):
        again.take(version=7, n=1, wait=wait)
    assert seen == {1: "stale: 0/2 valid (2 stale, 0 crashed)", 2: "stale: 0/2 valid (2 stale, 0 crashed)"}
