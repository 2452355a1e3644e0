"""The roles wired (finetune/rl/run.py) on `tiny` with the scripted task family: the synchronous run learns, the
asynchronous run with staleness 0 gives the synchronous result, a weight push is visible as the server's version,
and a killed run resumes from its last optimizer step with its buffered rollouts (not regenerated)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from finetune.rl.config import RLConfig
from finetune.rl.run import run_rl, summary
from finetune.rl.scripted import ScriptedFamily, ScriptedTask, digit_tasks
from finetune.rl.server import InProcessServer
from tests.finetune.rl.conftest import peaky_model

SMALL = {"groups_per_step": 2, "group_size": 4, "max_new_tokens": 5, "lr": 5e-3, "concurrency": 8}


class CountingFamily(ScriptedFamily):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.resets: list[str] = []

    def reset(self, task, workdir, sample=0):
        self.resets.append(workdir.name)
        return super().reset(task, workdir, sample)


def _trained(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_sync_run_learns_the_scripted_family(tok, tmp_path):
    cfg = RLConfig(steps=16, sync=True, **SMALL)
    hist = run_rl(peaky_model(), tok, ScriptedFamily(), digit_tasks(4), cfg, tmp_path, max_model_len=256)
    s = summary(hist)
    assert s["reward_first"] < 0.5 and s["reward_last"] > s["reward_first"] + 0.3, [h["reward_mean"] for h in hist]
    assert all(h["is_masked"] == 0.0 and h["mismatch"] < 1e-4 for h in hist)  # on-policy: engine == trainer
    assert all(h["staleness_hist"] == {"0": 8} for h in hist) and [h["version"] for h in hist] == list(range(1, 17))
    assert all(h["pg_grad_norm"] > 0 for h in hist if h["groups_with_signal"])
    assert {"reward_std", "solved_rate", "rollout_tokens_per_s", "train_tokens_per_s", "server_idle_s"} <= set(hist[0])
    assert all(h["refused_calls"] == 0 for h in hist)  # the scripted tools refuse nothing


def test_async_with_staleness_0_gives_the_sync_result(tok, tmp_path):
    runs = {}
    for sync in (True, False):
        model = peaky_model()
        cfg = RLConfig(steps=3, sync=sync, max_staleness=0, objective="icepop", **SMALL)
        hist = run_rl(model, tok, ScriptedFamily(turns=2), digit_tasks(4), cfg, tmp_path / str(sync), max_model_len=256)
        runs[sync] = (hist, _trained(model))
    (h_sync, w_sync), (h_async, w_async) = runs[True], runs[False]
    assert [h["reward_mean"] for h in h_async] == [h["reward_mean"] for h in h_sync]
    assert [h["model_calls"] for h in h_async] == [h["model_calls"] for h in h_sync]
    assert [h["train_tokens"] for h in h_async] == [h["train_tokens"] for h in h_sync]
    assert all(h["staleness_hist"] == {"0": 8} and h["groups_dropped"] == 0 for h in h_async)
    # The same three steps. The engine's batches may differ, and with them fp32 summation order in the rollout
    # logprobs (Adam magnifies such noise on near-zero gradients): the bound is 0.1% of the weights' scale; a
    # different batch or step would be off by the whole update (lr * steps = 1.5e-2 here).
    for n, w in w_sync.items():
        scale = w.abs().max().item() + 1e-12
        assert (w - w_async[n]).abs().max().item() <= 1e-3 * scale, n


def test_async_runs_ahead_within_the_staleness_bound_and_drops_crashed_groups(tok, tmp_path):
    def crash(task, sample):  # task digit-1 always crashes 3 of 4 sessions (dropped), digit-2 one of 4 (padded)
        return (task == "digit-1" and sample < 3) or (task == "digit-2" and sample == 0)

    cfg = RLConfig(steps=4, max_staleness=1, **SMALL)
    hist = run_rl(peaky_model(), tok, ScriptedFamily(crash=crash), digit_tasks(4), cfg, tmp_path, max_model_len=256)
    assert all(int(lag) <= 1 for h in hist for lag in h["staleness_hist"])
    assert sum(h["groups_dropped"] for h in hist) >= 1 and all(h["groups_kept"] == 2 for h in hist)
    drops = {why for h in hist for why in h["dropped_groups"].values()}
    assert drops == {"crashed: 1/4 valid (0 stale, 3 crashed)"}
    assert sum(h["padded_samples"] for h in hist) >= 1


@pytest.mark.parametrize("sync", [True, False])
def test_dynamic_sampling_trains_on_groups_with_signal_and_records_what_it_drew(tok, tmp_path, sync):
    # two tasks every session solves (the pattern matches any reply: all rewards 1, no signal) and two digit tasks
    tasks = [ScriptedTask(f"any-{i}", "say anything", "^") for i in range(2)] + digit_tasks(2)
    cfg = RLConfig(steps=3, sync=sync, dynamic_sampling=2, **SMALL)
    hist = run_rl(peaky_model(), tok, ScriptedFamily(), tasks, cfg, tmp_path, max_model_len=256)
    assert len(hist) == 3 and all(h["groups_kept"] == 2 for h in hist)
    drops = [why for h in hist for why in h["dropped_groups"].values()]
    assert "no_signal: all 4 rewards 1" in drops and all(w.startswith("no_signal") for w in drops)
    for h in hist:
        n = h["dropped_by_reason"].get("no_signal", 0)
        assert n <= 2 * 2  # the limit: dynamic_sampling x groups_per_step
        if n < 4:  # under the limit every kept group has signal
            assert h["groups_with_signal"] == 2, h
        if n:  # the row says what the step drew, the dropped groups' sessions included
            assert h["drawn_sessions"] == h["sessions"] + 4 * n
            assert h["drawn_reward_mean"] >= h["reward_mean"] - 1e-9
        else:
            assert "drawn_reward_mean" not in h
    assert summary(hist)["groups_no_signal"] == len(drops)


def test_async_starts_no_group_past_the_last_step(tok, tmp_path):
    # tau = 2 would admit 3 steps' groups ahead; the run has 2 steps: exactly their 2 x 2 groups x 4 sessions start
    fam = CountingFamily()
    cfg = RLConfig(steps=2, max_staleness=2, **SMALL)
    hist = run_rl(peaky_model(), tok, fam, digit_tasks(4), cfg, tmp_path, max_model_len=256)
    assert len(hist) == 2 and len(fam.resets) == 2 * 2 * 4, sorted(fam.resets)


def test_a_weight_push_is_visible_as_the_servers_version(tok, tmp_path):
    model = peaky_model()
    import copy

    server = InProcessServer(copy.deepcopy(model), tok, 256, 8)
    seen = []
    cfg = RLConfig(steps=3, max_staleness=0, **SMALL)
    try:
        run_rl(model, tok, ScriptedFamily(), digit_tasks(4), cfg, tmp_path, server=server,
               log=lambda row: seen.append((row["version"], server.version)))  # fmt: skip
        served = {n: p for n, p in server.engine.model.named_parameters() if n in _trained(model)}
        assert all(torch.equal(served[n], w) for n, w in _trained(model).items())  # the push copied them in
    finally:
        server.close()
    assert seen == [(1, 1), (2, 2), (3, 3)]
    rollouts = list((tmp_path / "rollouts").glob("*.json"))
    assert rollouts == []  # consumed groups leave the buffer


def test_a_killed_run_resumes_from_its_last_step_with_its_buffered_rollouts(tok, tmp_path):
    cfg = RLConfig(steps=4, max_staleness=1, **SMALL)

    class Killed(Exception):
        pass

    def kill_after_2(row):
        if row["step"] == 2:
            # killed once the feeder has run ahead (its thread goes on while this one waits): on a busy machine it
            # may not have finished a later group's rollout by the time step 2 is logged
            deadline = time.monotonic() + 120
            while not any((tmp_path / "rollouts").glob("*.json")) and time.monotonic() < deadline:
                time.sleep(0.05)
            raise Killed

    fam = CountingFamily()
    with pytest.raises(Killed):
        run_rl(peaky_model(), tok, fam, digit_tasks(4), cfg, tmp_path, max_model_len=256, log=kill_after_2)
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    assert state["trainer"]["version"] == 2 and len(state["history"]) == 2
    buffered = {p.stem for p in (tmp_path / "rollouts").glob("*.json")}
    assert buffered  # the feeder had run ahead: finished rollouts of later groups are on disk
    again = CountingFamily()
    hist = run_rl(peaky_model(), tok, again, digit_tasks(4), cfg, tmp_path, max_model_len=256)
    assert [h["step"] for h in hist] == [1, 2, 3, 4] and hist[:2] == state["history"]
    assert hist[2]["resumed_rollouts"] == len(buffered)
    assert not buffered & set(again.resets)  # finished rollouts were not regenerated
    assert all(int(lag) <= 1 for h in hist for lag in h["staleness_hist"])
    consumed = set(torch.load(tmp_path / "state.pt", weights_only=False)["consumed"])
    assert len(consumed) == 8 and json.dumps(hist)  # every step trained two groups, none twice
