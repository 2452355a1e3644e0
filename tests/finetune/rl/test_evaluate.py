"""Held-out evaluation during an RL run (finetune/rl/evaluate.py, run.py's `evaluate`): before training, every
N steps and after the last, on the weights the server serves after the push, with its own seeds; held-out tasks
that are also training tasks are refused."""

from __future__ import annotations

import pytest

from finetune.rl.config import RLConfig
from finetune.rl.evaluate import HeldOut, disjoint
from finetune.rl.run import run_rl
from finetune.rl.scripted import ScriptedFamily, ScriptedTask, digit_tasks
from tests.finetune.rl.conftest import peaky_model

HELD = [ScriptedTask("held-0", "say a year"), ScriptedTask("held-1", "give a page number")]


@pytest.mark.slow
def test_the_held_out_rate_is_measured_before_every_n_steps_and_after_the_last_on_the_pushed_weights(tok, tmp_path):
    cfg = RLConfig(steps=3, groups_per_step=2, group_size=4, max_new_tokens=5, lr=5e-3, concurrency=8)
    calls = []
    held = HeldOut(ScriptedFamily(), HELD, 3, tok, cfg, tmp_path / "eval", max_model_len=256)

    def evaluate(server, step):
        calls.append((step, server.version))
        return held(server, step)

    hist = run_rl(peaky_model(), tok, ScriptedFamily(), digit_tasks(4), cfg, tmp_path / "run", max_model_len=256,
                  evaluate=evaluate, eval_every=2)  # fmt: skip
    assert calls == [(0, 0), (2, 2), (3, 3)]  # asynchronous run: the server already serves step k's weights
    before = hist[0]["eval_before"]
    assert before["eval_step"] == 0 and before["eval_versions"] == [0]
    assert "eval_solved_rate" not in hist[0]
    for row in hist[1:]:
        assert row["eval_step"] == row["step"] and row["eval_versions"] == [row["step"]]
        assert row["eval_sessions"] == 6 and row["eval_env_errors"] == 0  # 2 tasks x 3 samples
        assert 0.0 <= row["eval_solved_rate"] <= 1.0 and set(row["eval_solved_by_task"]) == {"held-0", "held-1"}
    assert not any((tmp_path / "eval").glob("step-*"))  # the sessions' folders are not kept


def test_the_same_weights_and_seeds_give_the_same_held_out_result(tok, tmp_path):
    from finetune.rl.server import InProcessServer

    cfg = RLConfig(group_size=2, max_new_tokens=5, concurrency=4)
    held = HeldOut(ScriptedFamily(), HELD, 2, tok, cfg, tmp_path, max_model_len=256)
    server = InProcessServer(peaky_model(), tok, 256, 4)
    try:
        a, b = held(server, 0), held(server, 1)
    finally:
        server.close()
    assert a.pop("eval_step") == 0 and b.pop("eval_step") == 1
    assert a == b


def test_held_out_tasks_that_are_training_tasks_are_refused():
    disjoint(digit_tasks(3), HELD)
    with pytest.raises(ValueError, match="1 held-out task.*digit-1"):
        disjoint(digit_tasks(3), [*HELD, digit_tasks(3)[1]])
    with pytest.raises(ValueError, match=">= 2"):
        HeldOut(ScriptedFamily(), HELD, 1, None, RLConfig(), "x")


@pytest.mark.parametrize("killed_in", ["evaluate", "log"])
def test_a_run_killed_between_its_last_step_and_that_steps_log_finishes_the_step_on_resume(tok, tmp_path, killed_in):
    """The last step is saved, then evaluated, then logged (the CLI writes its adapter there). Killed in between,
    the rerun has no step left to train, and still evaluates that step (unless it already was), puts the result in
    its row and logs it."""
    cfg = RLConfig(steps=2, groups_per_step=1, group_size=2, max_new_tokens=5, lr=5e-3, concurrency=4)

    class Killed(Exception):
        pass

    calls, logged, killed = [], [], []

    def evaluate(server, step):
        if killed_in == "evaluate" and step == 2 and not calls.count(2):
            calls.append(2)
            raise Killed
        calls.append(step)
        return {"eval_step": step, "eval_solved_rate": 0.25 * step}

    def log(row):
        if killed_in == "log" and row["step"] == 2 and not killed:
            killed.append(row)
            raise Killed
        logged.append(row)

    with pytest.raises(Killed):
        run_rl(peaky_model(), tok, ScriptedFamily(), digit_tasks(4), cfg, tmp_path, max_model_len=256, log=log,
               evaluate=evaluate)  # fmt: skip
    n_calls = len(calls)
    del logged[:]
    hist = run_rl(peaky_model(), tok, ScriptedFamily(), digit_tasks(4), cfg, tmp_path, max_model_len=256, log=log,
                  evaluate=evaluate)  # fmt: skip
    assert [h["step"] for h in hist] == [1, 2] and hist[1]["eval_solved_rate"] == 0.5
    assert [r["step"] for r in logged] == [2] and logged[0]["eval_solved_rate"] == 0.5
    assert calls[n_calls:] == ([2] if killed_in == "evaluate" else [])  # an evaluation that finished is not redone
