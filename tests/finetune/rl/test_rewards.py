"""Hybrid rewards (finetune/rl/rewards.py): rules, an outcome reward model (a checkpoint), a generative judge (an
OpenAI-compatible endpoint with a rubric) and reward plugins, weighted; a part that cannot score is left out and
named, never scored 0; bad specs are named."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request

from finetune.rl.rewards import HybridReward, RewardSpecError, parse_reward_spec
from tests.serve.conftest import tiny_checkpoint  # noqa: F401 (a fixture)
from tests.serve.server_thread import ServerThread


@pytest.fixture(scope="module")
def judge():
    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append(body)
        return {"choices": [{"message": {"role": "assistant", "content": "Reasoning...\nscore: 0.8"}}]}

    with ServerThread(app) as s:
        s.seen = seen
        yield s


def test_the_reward_is_the_weighted_mean_of_the_parts(judge, tiny_checkpoint):  # noqa: F811
    spec = parse_reward_spec({
        "rules": {"weight": 2.0},
        "judge": {"base_url": judge.url + "/v1", "rubric": "Is the fix minimal?", "weight": 1.0},
        "reward_model": {"checkpoint": str(tiny_checkpoint), "weight": 1.0},
        "plugins": [{"type": "regex", "pattern": "Fixes", "weight": 1.0}],
    })  # fmt: skip
    reward, detail = HybridReward(spec).score("fix the bug", "Fixes #1\n--- a/x.py", rules=1.0)
    parts = detail["parts"]
    assert parts["rules"] == 1.0 and parts["judge"] == 0.8 and parts["plugin:regex"] == 1.0
    assert 0.0 < parts["reward_model"] < 1.0  # P(yes) against P(no) from the checkpoint
    assert reward == pytest.approx((2 * 1.0 + 0.8 + parts["reward_model"] + 1.0) / 5)
    prompt = judge.seen[-1]["messages"][0]["content"]
    assert "Is the fix minimal?" in prompt and "fix the bug" in prompt and "Fixes #1" in prompt


def test_a_part_that_cannot_score_is_left_out_not_zero():
    spec = parse_reward_spec({"judge": {"base_url": "http://127.0.0.1:9/v1", "rubric": "r", "timeout": 2}})
    reward, detail = HybridReward(spec).score("t", "r", rules=0.0)
    assert reward == 0.0 and detail["unscored"] == ["judge"]  # the rules' 0.0, alone
    reward, detail = HybridReward(spec).score("t", "r", rules=None)
    assert reward is None and detail["unscored"] == ["rules", "judge"]


@pytest.mark.parametrize(
    "spec, msg",
    [
        ([], "a reward spec is a JSON object"),
        ({"tests": {}}, "unknown part(s) tests"),
        ({"rules": {"weight": -1}}, '"rules.weight" must be a number >= 0'),
        ({"reward_model": {}}, '"reward_model" needs "checkpoint"'),
        ({"reward_model": {"checkpoint": "/nonexistent"}}, "/nonexistent is not a checkpoint"),
        ({"judge": {"base_url": "http://x"}}, '"judge" needs "base_url"'),
        ({"plugins": [{"type": "llm"}]}, "unknown reward plugin 'llm'"),
        ({"plugins": [{"type": "regex"}]}, "plugin regex:"),
    ],
)
def test_bad_specs_are_named(spec, msg):
    with pytest.raises(RewardSpecError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        parse_reward_spec(spec)
