"""The single-turn environment and what the one RL gained from finetune/grpo.py: CompletionEnv's sessions (one
raw-ids call, the text scored, None left out as UNSCORED), unscored sessions kept in their group by the buffer,
the gathered engine batch, further updates on a batch (pi_train_old, PPO's clip) and the LR warm-up.
The whole completion run (learning, resume, a reward that cannot run) is tests/finetune/test_grpo.py's."""

from __future__ import annotations

import pytest
import torch

from finetune.rl.buffer import apply_rules
from finetune.rl.completion import CompletionEnv, RLTask
from finetune.rl.config import RLConfig
from finetune.rl.objective import sample_loss
from finetune.rl.rollout import ENV_ERROR, OK, UNSCORED, Grade, Rollout
from finetune.rl.server import GenParams, InProcessServer
from finetune.rl.session_model import SessionModel
from finetune.rl.trainer import Trainer
from tests.finetune.rl.conftest import peaky_model
from tests.finetune.rl.test_trainer import _group


def test_a_completion_session_samples_once_on_the_raw_ids_and_scores_the_text(tok, tmp_path):
    def score(text):
        return None if "!" in text else float(len(text) > 0)

    score.last_error = "`checker` exited 127: not found"
    server = InProcessServer(peaky_model(), tok, max_model_len=64, max_num_seqs=2)
    try:
        prompt = tok.encode("def f(x):")
        env = CompletionEnv(tok, groups_per_step=2)
        model = SessionModel(server, tok, "g3-s1", max_new_tokens=4, temperature=1.0, seed=7)
        session = env.reset(RLTask(prompt, score), tmp_path, 1)
        session.run(model)
        (call,) = model.tito.calls
        assert call.prompt_ids == prompt and len(call.output_ids) == len(call.logprobs) >= 1  # no chat format
        (sample,) = model.tito.samples()
        assert sample.ids[: len(prompt)] == prompt and sample.mask == [0] * len(prompt) + [1] * len(call.output_ids)
        assert session.text == tok.decode(call.output_ids, skip_special_tokens=True)
        # the seed of group 3 = step 1, place 1 of 2: finetune/grpo.py's own loop's (seed, step, g, i)
        assert env.seed_of(7, "g3-s1") == hash((7, 1, 1, 1)) & 0x7FFFFFFF
        session.text = "a!"
        assert session.grade() == Grade(None, None, UNSCORED, "`checker` exited 127: not found")
        session.text = "ok"
        assert session.grade() == Grade(1.0)
    finally:
        server.close()


def test_gathered_calls_are_one_batch_in_session_order_whoever_posts_first(tok):
    """The rollout logprobs of a call depend on its engine batch (fp32 sums): gathered, the same calls give the
    same numbers whatever order their threads post them in."""
    import threading

    prompt = tok.encode("class A:")
    results = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        server = InProcessServer(peaky_model(), tok, max_model_len=64, max_num_seqs=4)
        try:
            server.gather(4)
            got = {}

            def call(i, server=server, got=got):
                got[i] = server.generate(prompt, GenParams(5, 1.0, seed=i), f"g0-s{i}")

            threads = [threading.Thread(target=call, args=(i,)) for i in order]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            results.append([(got[i].ids, got[i].logprobs) for i in range(4)])
        finally:
            server.close()
    assert results[0] == results[1]


def test_unscored_sessions_stay_in_their_group_and_crashes_do_not():
    group = [Rollout(0, i, 0, status=OK, reward=float(i % 2)) for i in range(2)]
    group += [Rollout(0, i, 0, status=UNSCORED) for i in (2, 3)]
    kept, why, counts = apply_rules(group, 0, 0, 4)
    assert kept == group and why == "" and counts["crashed"] == 0  # not padded: the unscored ones are left out
    crashed = group[:2] + [Rollout(0, i, 0, status=ENV_ERROR) for i in (2, 3)]
    assert apply_rules(crashed, 0, 0, 4)[0] is None  # half valid: dropped, as before


def test_a_further_update_on_the_batch_is_the_first_at_pi_train_old_then_clipped():
    # At q = pi_theta / pi_train_old = 1 the PPO term is the on-policy term, value and gradient.
    lp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    rollout = torch.tensor([-1.1, -1.9, -0.5])
    band = (0.5, 2.0)
    plain, st = sample_loss(lp, rollout, 0.7, band)
    (g_plain,) = torch.autograd.grad(plain, lp)
    ppo, st_old = sample_loss(lp, rollout, 0.7, band, old_N=lp.detach())
    (g_ppo,) = torch.autograd.grad(ppo, lp)
    assert float(ppo.detach()) == pytest.approx(float(plain.detach()), rel=1e-6)
    assert torch.allclose(g_ppo, g_plain, rtol=1e-6)
    assert st_old.masked == st.masked and st_old.clipped == 0
    # Moved past 1 + eps_high with a positive advantage: clipped, no gradient from that token.
    _, st = sample_loss(lp, rollout, 0.7, band, old_N=lp.detach() - torch.tensor([0.0, 0.5, 0.0]), clip=(0.8, 1.28))
    assert st.clipped == 1
    loss, _ = sample_loss(lp, rollout, 0.7, band, old_N=lp.detach() - torch.tensor([0.0, 0.5, 0.0]))
    (g,) = torch.autograd.grad(loss, lp)
    assert g[1] == 0 and g[0] != 0


def test_updates_per_batch_reuse_the_batch_and_the_warm_up_ramps_the_learning_rate():
    model = peaky_model()
    tr = Trainer(model, RLConfig(group_size=2, lr=1e-2, warmup=4, updates_per_batch=3))
    st = tr.step([_group(model, [1.0, 0.0])])
    assert tr.version == 1 and tr.opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)
    assert "clipped" in st and 0.0 <= st["clipped"] <= 1.0 and st["pg_grad_norm"] > 0
    assert next(iter(tr.opt.state.values()))["step"] == 3  # three optimizer steps on the one batch
    tr.step([_group(model, [1.0, 0.0])])
    assert tr.opt.param_groups[0]["lr"] == pytest.approx(2e-2 / 4)
    assert [RLConfig(lr=1.0, warmup=4).lr_at(k) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert "clipped" not in Trainer(peaky_model(), RLConfig(group_size=2)).step([_group(model, [1.0, 0.0])])
    with pytest.raises(ValueError, match="updates_per_batch"):
        RLConfig(updates_per_batch=0)
    with pytest.raises(ValueError, match="warmup"):
        RLConfig(warmup=-1)


def test_a_call_refused_while_gathering_does_not_hold_the_others_back(tok):
    server = InProcessServer(peaky_model(), tok, max_model_len=16, max_num_seqs=2)
    try:
        server.gather(2)
        with pytest.raises(ValueError, match="fills the context"):
            server.generate(list(range(5, 25)), GenParams(3, 1.0, seed=0), "g0-s0")
        assert len(server.generate([5, 6, 7], GenParams(3, 1.0, seed=1), "g0-s1").ids) >= 1
    finally:
        server.close()
