"""A glm5 Rollout as slime Samples (slime/utils/types.py: tokens, response_length, loss_mask over the response,
rollout_log_probs over the response, reward, rollout_id, weight_versions, status, session_id, metadata).

One Sample per branch of the session (finetune/rl/tito.py: a branch is one token sequence every call of it
extended; a re-rendered history starts another). A branch's response is everything from its first sampled token
on: the tool results between turns are in it with loss_mask 0, the sampled tokens with 1 and their rollout
logprobs. Every segment of a session carries the session's reward (GLM-5's objective: every model token of the
session is credited with its outcome) and the same rollout_id, so slime's loss averages within the session
instead of counting it once per segment. A session the environment failed (not the model: a crashed sandbox)
comes back marked `remove_sample` with status FAILED and reward 0, so it trains nothing."""

from __future__ import annotations

import copy

from finetune.rl.rollout import Rollout


def slime_samples(base, rollout: Rollout, sample_type) -> list:
    """`base`: the Sample slime passed in (its prompt, index, group). -> one Sample per trainable branch."""
    rid = base.rollout_id if base.rollout_id is not None else base.index
    meta = dict(base.metadata or {}) | {"glm5": {"status": rollout.status, "solved": rollout.solved,
                                                  "error": rollout.error, "calls": len(rollout.calls)}}  # fmt: skip
    out = []
    for b, ts in enumerate(rollout.samples):
        if not any(ts.mask):
            continue
        p = ts.mask.index(1)
        s = copy.copy(base)
        s.tokens, s.response_length = list(ts.ids), len(ts.ids) - p
        s.loss_mask, s.rollout_log_probs = list(ts.mask[p:]), [float(x) for x in ts.logprobs[p:]]
        versions = sorted({v for c in rollout.calls if c.branch == b for v in (c.version_start, c.version_end)})
        s.weight_versions = [str(v) for v in versions]
        s.rollout_id, s.metadata = rid, meta
        s.reward = float(rollout.reward) if rollout.valid else 0.0
        s.status = sample_type.Status.COMPLETED if rollout.valid else sample_type.Status.FAILED
        s.remove_sample = not rollout.valid
        out.append(s)
    if not out:  # nothing sampled (the environment failed before the first call): one sample that trains nothing
        s = copy.copy(base)
        s.tokens, s.response_length, s.loss_mask, s.rollout_log_probs = [0, 0], 1, [0], [0.0]
        s.reward, s.rollout_id, s.metadata, s.remove_sample = 0.0, rid, meta, True
        s.status = sample_type.Status.FAILED
        out.append(s)
    return out
