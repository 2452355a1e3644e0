"""Scores: pass@k against brute-force enumeration, the Wilson interval against known values, infra kept out."""

from __future__ import annotations

import itertools

import pytest

from agent.bench.scores import paired_difference, pass_at_k, pass_hat_k, per_task, summarize, wilson


@pytest.mark.parametrize("n,c,k", [(5, 2, 1), (5, 2, 2), (5, 2, 3), (4, 0, 2), (4, 4, 3), (6, 1, 4)])
def test_pass_at_k_is_the_probability_over_all_k_subsets(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    any_ok = sum(1 for s in subsets if any(outcomes[i] for i in s)) / len(subsets)
    all_ok = sum(1 for s in subsets if all(outcomes[i] for i in s)) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(any_ok, rel=1e-12)
    assert pass_hat_k(n, c, k) == pytest.approx(all_ok, rel=1e-12, abs=1e-15)


def test_wilson_interval_known_values():
    lo, hi = wilson(8, 10)  # textbook: 0.4902 .. 0.9433
    assert lo == pytest.approx(0.4902, abs=5e-4) and hi == pytest.approx(0.9433, abs=5e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 1.0)


def _r(i, a, status):
    return {"instance_id": i, "attempt": a, "status": status, "resolved": {"resolved": True, "unresolved": False}.get(status),
            "reward": 1.0 if status == "resolved" else 0.0, "seconds": 1.0, "prompt_tokens": 10, "completion_tokens": 5}  # fmt: skip


def test_infra_errors_stay_out_of_the_score():
    rs = [_r("a", 0, "resolved"), _r("a", 1, "unresolved"), _r("b", 0, "infra_error"), _r("b", 1, "resolved")]
    s = summarize(rs, k=2)
    assert s["graded"] == 3 and s["infra_errors"] == 1 and s["resolved_rate"] == pytest.approx(2 / 3)
    assert s["pass@1"] == pytest.approx((0.5 + 1.0) / 2)
    assert s["pass@2"] == pytest.approx(1.0)  # only task a has 2 graded attempts
    assert s["prompt_tokens"] == 40 and s["seconds_per_trial"] == 1.0


def test_paired_difference_and_flips():
    a = per_task([_r("x", 0, "resolved"), _r("y", 0, "unresolved"), _r("z", 0, "unresolved")])
    b = per_task([_r("x", 0, "unresolved"), _r("y", 0, "resolved"), _r("z", 0, "resolved")])
    d = paired_difference(a, b)
    assert d["mean_difference"] == pytest.approx(1 / 3) and d["gained"] == ["y", "z"] and d["lost"] == ["x"]
    lo, hi = d["ci95"]
    assert lo < d["mean_difference"] < hi


def test_trial_pairs_count_outcomes_and_sessions_alike_call_for_call(tmp_path):
    """`bench compare`'s trial section: attempt i of a task in both runs; sessions alike when every model call said
    the same (content and tool calls); a trial without a trajectory is compared on its outcome only."""
    import json

    from agent.bench.reports import trial_pairs

    def trial(name, said):
        d = tmp_path / name
        d.mkdir()
        recs = [{"type": "session"}] + [
            {"type": "model_call", "response": {"choices": [{"message": {"content": c, "tool_calls": [
                {"id": f"call-{name}", "function": {"name": "read", "arguments": a}}]}}]}} for c, a in said
        ]  # fmt: skip
        (d / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return str(d)

    same = [("", '{"path": "a.py"}'), ("done", "{}")]
    a = {"tasks": {"t1": {"attempts": [{"attempt": 0, "resolved": True, "trial_dir": trial("a0", same)},
                                       {"attempt": 1, "resolved": False, "trial_dir": trial("a1", same)}]},
                   "t2": {"attempts": [{"attempt": 0, "resolved": True, "trial_dir": None}]}}}  # fmt: skip
    b = {"tasks": {"t1": {"attempts": [{"attempt": 0, "resolved": True, "trial_dir": trial("b0", same)},
                                       {"attempt": 1, "resolved": True, "trial_dir": trial("b1", same[:1])}]},
                   "t2": {"attempts": [{"attempt": 0, "resolved": False, "trial_dir": None}]}}}  # fmt: skip
    # call ids differ between runs (random per session): not what the model said, so not compared
    assert trial_pairs(a, b) == {"compared": 3, "outcomes_alike": 1, "sessions_compared": 2, "sessions_alike": 1}


def test_the_paired_interval_is_honest_when_every_task_moved_alike():
    # the report: `bench compare` gave +100 to +100 over 15 tasks (mean ± t·sd with sd 0)
    a = per_task([_r(f"t{i}", 0, "unresolved") for i in range(15)])
    b = per_task([_r(f"t{i}", 0, "resolved") for i in range(15)])
    d = paired_difference(a, b)
    lo, hi = d["ci95"]
    assert d["mean_difference"] == 1.0 and hi == 1.0 and lo == pytest.approx(0.7112, abs=1e-3)
    same = paired_difference(a, a)["ci95"]  # no change at all: an interval around 0, not [0, 0]
    assert same[0] < 0 < same[1] and same[1] == pytest.approx(0.204, abs=1e-3)
    # widths shrink with more tasks and the interval always holds the observed difference, inside [-1, 1]
    import random

    rng = random.Random(0)
    for m in (2, 5, 30, 200):
        ra = [_r(f"t{i}", 0, "resolved" if rng.random() < 0.4 else "unresolved") for i in range(m)]
        rb = [_r(f"t{i}", 0, "resolved" if rng.random() < 0.6 else "unresolved") for i in range(m)]
        d = paired_difference(per_task(ra), per_task(rb))
        lo, hi = d["ci95"]
        assert -1 <= lo <= d["mean_difference"] <= hi <= 1 and hi > lo
