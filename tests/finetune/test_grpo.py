"""GRPO + IcePop on completions (finetune/grpo.py: the one RL's completion env, finetune/rl's Trainer and run_rl):
group advantages, the IcePop mask, the direction of the update, learning a checkable reward on `tiny` with
rollouts from the engine serving the model being trained, left-out completions, and exact resume."""

from __future__ import annotations

import threading

import pytest
import torch

from finetune.grpo import RL_TARGETS, RewardUnavailable, RLTask, advantages, task_order, train_grpo
from finetune.rl.config import RLConfig
from finetune.rl.rollout import Rollout, TokenSample
from finetune.rl.trainer import Trainer
from finetune.sft import LoraSettings, add_lora
from model import GLM5ForCausalLM
from model.tokenizer import Tokenizer
from plugins.builtin_rewards import register_rewards

torch.set_num_threads(1)
REWARDS: dict = {}
register_rewards(lambda name, make: REWARDS.__setitem__(name, make), None)
PROMPTS = ["def f(x):", "import os\n", "class A:", "# note"]


def peaky_model(tiny_model_cfg=None):
    """`tiny` with its lm_head scaled 20x (a random tiny's logits all sit within ~1 of each other, so nothing is
    learnable in a few steps; a trained head has this range), LoRA on RL_TARGETS."""
    from model.config import preset

    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return add_lora(model, LoraSettings(rank=8, alpha=16, targets=RL_TARGETS), seed=0)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.shipped()


def tasks(tok, pattern=r"[0-9]", score=None):
    s = score or REWARDS["regex"]({"type": "regex", "pattern": pattern})
    return [RLTask(tok.encode(p), s, p) for p in PROMPTS]


def test_advantages_are_normalised_per_group():
    a = advantages([1.0, 0.0, 0.0, 1.0])
    assert a == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]  # no signal
    assert advantages([1.0, None, 0.0])[1] is None and advantages([1.0, None, 0.0])[0] > 0  # left out
    assert advantages([1.0, None]) == [0.0, None]  # one scored completion: nothing to compare


def test_task_order_is_seeded_and_covers_every_task_each_epoch():
    for epoch in range(3):
        assert sorted(t for s in range(2 * epoch, 2 * epoch + 2) for t in task_order(4, s, 2, seed=3)) == [0, 1, 2, 3]
    # Pinned: a resumed run (another process, maybe another Python) must read the tasks the killed one read.
    assert [task_order(4, s, 2, seed=3) for s in range(4)] == [[2, 3], [1, 0], [3, 0], [1, 2]]
    assert task_order(5, 7, 3, seed=1) == [4, 1, 3]  # a step that straddles two epochs
    assert [task_order(4, s, 2, seed=3) for s in range(4)] != [task_order(4, s, 2, seed=4) for s in range(4)]


def completion(prompt, ids, infer, reward, index=0):
    """One completion as the one RL holds it: a rollout whose one token sample is prompt + completion."""
    sample = TokenSample(prompt + ids, [0] * len(prompt) + [1] * len(ids), [0.0] * len(prompt) + list(infer), 0)
    return Rollout(0, index, 0, reward=reward, samples=[sample])


def grpo_backward(model, groups, cfg, micro_batch=8):
    """The Trainer's loss on `groups`, back-propagated (the test steps its own optimizer) -> (loss or None, stats)."""
    loss, st, _ = Trainer(model, cfg, micro_batch=micro_batch).backward(groups)
    return loss, st.as_dict()


def _rollout(model, prompt, ids, reward, shift=0.0):
    """A completion with its true logprobs as the 'inference' ones (shifted by `shift` in log space)."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + ids]))[0].float(), -1)
    infer = [float(lp[len(prompt) - 1 + i, t]) + shift for i, t in enumerate(ids)]
    return completion(prompt, ids, infer, reward)


def _infer(r):
    return [x for x, m in zip(r.samples[0].logprobs, r.samples[0].mask, strict=True) if m]


def test_the_engine_samples_with_the_probabilities_the_trainer_computes(tok):
    # The rollouts' logprobs come from the engine (its paged cache, absorbed attention, sampler), the trainer's
    # from the model's training forward: on the same weights they agree, so IcePop masks nothing.
    from serve.engine import EngineConfig, LLMEngine, SamplingParams

    model = peaky_model()
    engine = LLMEngine(model, tokenizer=tok, config=EngineConfig(max_num_seqs=4, max_model_len=64))
    prompt = tok.encode("def f(x):")
    for i in range(4):
        engine.add_request(prompt, SamplingParams(temperature=1.0, max_tokens=8, seed=i), request_id=str(i))
    outs = {}
    while engine.has_unfinished:
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    group = [completion(prompt, list(o.token_ids), [lp.logprob for lp in o.logprobs], float(i % 2), i)
             for i, o in enumerate(outs[str(i)] for i in range(4))]  # fmt: skip
    assert len({tuple(r.samples[0].ids) for r in group}) > 1  # sampled, not greedy: it covers several paths
    _, stats = grpo_backward(model, [group], RLConfig(group_size=4, sync=True))
    assert stats["is_masked"] == 0.0 and stats["mismatch"] < 1e-4, stats
    assert stats["kl_rollout"] < 1e-6


def test_the_update_raises_the_rewarded_completion_and_icepop_drops_mismatched_tokens(tok):
    model = peaky_model()
    cfg = RLConfig(group_size=2, lr=1e-2, sync=True)  # sync: IcePop's band
    prompt = tok.encode("def f(x):")
    good, bad = [11, 12, 13], [21, 22, 23]
    group = [_rollout(model, prompt, good, 1.0), _rollout(model, prompt, bad, 0.0)]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.05)
    before = [_infer(_rollout(model, prompt, ids, 0)) for ids in (good, bad)]
    grpo_backward(model, [group], cfg)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)  # a gradient, though the loss is 0
    opt.step()
    after = [_infer(_rollout(model, prompt, ids, 0)) for ids in (good, bad)]
    assert sum(after[0]) > sum(before[0]) and sum(after[1]) < sum(before[1])
    # Sampling probabilities 3x off the trainer's (log 3 > log 2 = IcePop's band): every token dropped, no gradient.
    model.zero_grad()
    far = [_rollout(model, prompt, good, 1.0, shift=1.1), _rollout(model, prompt, bad, 0.0, shift=-1.1)]
    _, stats = grpo_backward(model, [far], cfg)
    assert stats["is_masked"] == 1.0
    assert all(p.grad is None or not p.grad.any() for p in params)
    # No signal (equal rewards): no loss at all.
    assert (
        grpo_backward(model, [[_rollout(model, prompt, good, 1.0), _rollout(model, prompt, bad, 1.0)]], cfg)[0] is None
    )


def test_grpo_learns_a_checkable_reward_with_on_policy_engine_rollouts(tok):
    model = peaky_model()
    cfg = RLConfig(steps=24, groups_per_step=2, group_size=8, max_new_tokens=6, lr=5e-3)
    hist = train_grpo(model, tasks(tok), cfg, tokenizer=tok)
    first, last = [sum(h.reward_mean for h in part) / 4 for part in (hist[:4], hist[-4:])]
    assert first < 0.5 and last > 0.85, [round(h.reward_mean, 2) for h in hist]
    assert all(h.icepop_masked < 0.01 for h in hist)  # engine and trainer compute the same probabilities
    assert hist[-1].step == 24 and all(h.groups == 2 for h in hist)
    assert all(h.pg_grad_norm > 0 for h in hist if h.groups_with_signal)  # what moves is reported, not a 0 loss


def test_a_reward_that_cannot_run_stops_the_run_with_its_error(tok):
    broken = REWARDS["command"]({"type": "command", "run": "no-such-checker --strict"})
    cfg = RLConfig(steps=3, groups_per_step=2, group_size=2, max_new_tokens=3)
    with pytest.raises(RewardUnavailable, match=r"step 1: no completion could be scored.*no-such-checker.*not found"):
        train_grpo(peaky_model(), tasks(tok, score=broken), cfg, tokenizer=tok)


def test_micro_batches_give_the_gradient_of_the_whole_batch(tok):
    model = peaky_model()
    prompt = tok.encode("def f(x):")
    group = [_rollout(model, prompt, [11 + i, 12, 13 + i], float(i % 2)) for i in range(6)]
    grads = []
    for mb in (6, 4, 1):
        model.zero_grad()
        grpo_backward(model, [group], RLConfig(group_size=6, sync=True), micro_batch=mb)
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    # The same sums in another order: fp32 rounding differs by CPU and BLAS build (5.7e-6 on gradients of 2.3 on an
    # AMD EPYC), so the bound is relative to the gradients' scale; a wrong micro-batch weighting is off by O(1).
    scale = max(g.abs().max().item() for g in grads[0])
    for other in grads[1:]:
        worst = max((a - b).abs().max().item() for a, b in zip(grads[0], other, strict=True))
        assert worst <= 1e-5 * scale, (worst, scale)


def test_completions_whose_check_fails_are_left_out(tok):
    calls, lock = [], threading.Lock()

    def flaky(text):  # every third check cannot run (checks run in parallel threads)
        with lock:
            calls.append(text)
            n = len(calls)
        return None if n % 3 == 0 else float("1" in text)

    cfg = RLConfig(steps=3, groups_per_step=2, group_size=6, max_new_tokens=4, lr=1e-3)
    hist = train_grpo(peaky_model(), tasks(tok, score=flaky), cfg, tokenizer=tok)
    assert sum(h.failed for h in hist) == len(calls) // 3 == 12


def test_a_resumed_run_is_the_interrupted_run(tok):
    cfg = RLConfig(steps=6, groups_per_step=2, group_size=4, max_new_tokens=5, lr=5e-3)
    whole = peaky_model()
    train_grpo(whole, tasks(tok), cfg, tokenizer=tok)

    states = []

    def killed_after_4(st):
        if st.step == 4:
            raise KeyboardInterrupt

    first = peaky_model()
    with pytest.raises(KeyboardInterrupt):
        train_grpo(first, tasks(tok), cfg, tokenizer=tok, log=killed_after_4, save=states.append, save_every=3)
    assert [s["step"] for s in states] == [3]
    resumed = peaky_model()
    hist = train_grpo(resumed, tasks(tok), cfg, tokenizer=tok, resume=states[-1])
    assert [h.step for h in hist] == [1, 2, 3, 4, 5, 6]
    for (n, a), b in zip(whole.named_parameters(), resumed.parameters(), strict=True):
        if a.requires_grad:
            assert torch.equal(a, b), n


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="group_size"):
        RLConfig(group_size=1)
    with pytest.raises(ValueError, match="temperature"):
        RLConfig(temperature=0)
    with pytest.raises(ValueError, match="nothing to train"):
        train_grpo(
            GLM5ForCausalLM.from_config(__import__("model.config").config.preset("tiny")).requires_grad_(False),
            [RLTask([1], lambda t: 0.0)],
            RLConfig(steps=1),
        )
