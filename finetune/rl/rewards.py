"""Hybrid rewards (GLM-5 §3.4): a reward spec combines rules (the bench's tests), an outcome reward model (a
checkpoint that scores a trajectory) and a generative judge (an OpenAI-compatible endpoint with a rubric), plus
any registered reward plugin, each with a weight. A task may carry its own spec (a SWE row's "reward" field), which
replaces `--reward`'s for that task.

    {"rules": {"weight": 1.0},
     "reward_model": {"checkpoint": "rm/", "weight": 0.5},
     "judge": {"base_url": "http://127.0.0.1:8000/v1", "model": "glm-5", "rubric": "...", "weight": 0.5,
               "api_key_env": "JUDGE_KEY"},
     "plugins": [{"type": "regex", "pattern": "Fixes #\\\\d+", "weight": 0.1}]}

The reward is the weighted mean of the parts that could score this session. A part that could not (the judge's
endpoint down, an unreadable score) is left out and named in the rollout's detail: unknown is never scored as 0.
No part at all -> no reward (the rollout counts as an environment failure). The outcome reward model reads the
task and the session's result (final message and patch) in our chat format and scores P("yes") against
P("no") for "Did this solve the task?" at its generation prompt: any checkpoint of this architecture, loaded
once per run.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

PARTS = ("rules", "reward_model", "judge", "plugins")
JUDGE_PROMPT = (
    "You grade an AI coding agent's work against a rubric.\n\nRubric:\n{rubric}\n\nTask:\n{task}\n\n"
    "What the agent produced (final message, then the diff):\n{result}\n\n"
    "Answer with one line: `score: X` where X is a number from 0 to 1."
)


class RewardSpecError(ValueError):
    pass


@dataclass(frozen=True)
class RewardSpec:
    rules: float = 1.0  # weight of the bench's grade (0: not used)
    reward_model: dict | None = None
    judge: dict | None = None
    plugins: tuple = ()
    raw: dict = field(default_factory=dict, compare=False)


def _weight(part: dict, name: str) -> float:
    w = part.get("weight", 1.0)
    if not isinstance(w, int | float) or w < 0:
        raise RewardSpecError(f'"{name}.weight" must be a number >= 0')
    return float(w)


def parse_reward_spec(spec: Any) -> RewardSpec:
    if not isinstance(spec, dict):
        raise RewardSpecError("a reward spec is a JSON object with some of: " + ", ".join(PARTS))
    unknown = set(spec) - set(PARTS)
    if unknown:
        raise RewardSpecError(f"unknown part(s) {', '.join(sorted(unknown))} (known: {', '.join(PARTS)})")
    rules = _weight(spec["rules"], "rules") if "rules" in spec else 1.0
    rm = spec.get("reward_model")
    if rm is not None and (not isinstance(rm, dict) or not isinstance(rm.get("checkpoint"), str)):
        raise RewardSpecError('"reward_model" needs "checkpoint": a checkpoint directory')
    if rm is not None and not os.path.isfile(os.path.join(rm["checkpoint"], "config.json")):
        raise RewardSpecError(f'"reward_model.checkpoint": {rm["checkpoint"]} is not a checkpoint (no config.json)')
    judge = spec.get("judge")
    if judge is not None:
        if not isinstance(judge, dict) or not all(isinstance(judge.get(k), str) for k in ("base_url", "rubric")):
            raise RewardSpecError('"judge" needs "base_url" (OpenAI-compatible) and "rubric" (text)')
    plugins = spec.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, dict) and "type" in p for p in plugins):
        raise RewardSpecError('"plugins" is a list of reward specs ({"type": ..., "weight": ...})')
    if plugins:
        from agent.plugin_registry import default_manager

        makers = default_manager().rewards()
        for p in plugins:
            if p["type"] not in makers:
                raise RewardSpecError(f"unknown reward plugin {p['type']!r} (known: {', '.join(makers)})")
            try:
                makers[p["type"]](p)
            except ValueError as e:
                raise RewardSpecError(f"plugin {p['type']}: {e}") from None
    for name in ("reward_model", "judge"):
        if spec.get(name) is not None:
            _weight(spec[name], name)
    return RewardSpec(rules, rm, judge, tuple(plugins), spec)


# What only the user's flags and config may say: a row of a tasks, reward or suite file is data, and data may
# narrow (a shorter timeout, less memory) but never switch the sandbox or the network, pick an endpoint or name a
# credential (a row naming a judge URL and an api_key_env would send that secret wherever it likes).
USER_ONLY = ("sandbox", "network", "base_url", "url", "endpoint", "api_key_env", "api_key", "headers", "env",
             "judge", "cwd")  # fmt: skip
NARROW_ONLY = {"timeout": 60, "memory_mb": 4096}  # a row may lower these below the user's (or these defaults)


def data_spec_problem(spec: Any, user_spec: dict | None) -> str | None:
    """Why a reward spec read from data (a task row) asks for more than the user chose, or None. `user_spec`: the
    user's own (--reward), whose limits a row may lower but not raise."""
    stack, seen = [spec], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > 10_000:
            return "the reward spec is too large"
        if isinstance(node, dict):
            for k, v in node.items():
                if k in USER_ONLY:
                    return (f'the row\'s reward sets "{k}": only --reward (the user\'s own flag) may turn the sandbox or '
                            "the network on or off, choose an endpoint, a folder or a credential; the row is refused")
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    for key, default in NARROW_ONLY.items():
        cap = (user_spec or {}).get(key, default) if isinstance(user_spec, dict) else default
        mine = spec.get(key) if isinstance(spec, dict) else None
        if mine is not None and isinstance(cap, int | float) and isinstance(mine, int | float) and mine > cap:
            return (f'the row\'s reward raises "{key}" to {mine} over {cap} (only --reward may raise it: '
                    "a row may only lower it); the row is refused")  # fmt: skip
    return None


class HybridReward:
    """Scores a session from its parts. `score(task_text, result_text, rules_reward)` -> (reward or None, detail)."""

    def __init__(self, spec: RewardSpec):
        self.spec = spec
        self._rm = None
        self._lock = threading.Lock()
        self._plugins = []
        if spec.plugins:
            from agent.plugin_registry import default_manager

            makers = default_manager().rewards()
            self._plugins = [(makers[p["type"]](p), _weight(p, p["type"]), p["type"]) for p in spec.plugins]

    def score(self, task_text: str, result_text: str, rules: float | None) -> tuple[float | None, dict]:
        parts: list[tuple[str, float, float | None]] = []
        if self.spec.rules:
            parts.append(("rules", self.spec.rules, rules))
        if self.spec.reward_model:
            parts.append(("reward_model", _weight(self.spec.reward_model, "reward_model"),
                          self._rm_score(task_text, result_text)))  # fmt: skip
        if self.spec.judge:
            parts.append(("judge", _weight(self.spec.judge, "judge"), self._judge(task_text, result_text)))
        for fn, w, name in self._plugins:
            parts.append((f"plugin:{name}", w, fn(result_text)))
        known = [(w, v) for _, w, v in parts if v is not None and w > 0]
        detail = {"parts": {n: v for n, _, v in parts}, "unscored": [n for n, _, v in parts if v is None]}
        total = sum(w for w, _ in known)
        return (sum(w * v for w, v in known) / total if total else None), detail

    def _rm_score(self, task_text: str, result_text: str) -> float | None:
        import torch

        from model import GLM5ForCausalLM
        from model.chat import render_ids
        from serve.engine.llm import load_tokenizer

        with self._lock:
            if self._rm is None:
                from pathlib import Path

                path = Path(self.spec.reward_model["checkpoint"])
                self._rm = (GLM5ForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), load_tokenizer(path))
            net, tok = self._rm
            q = f"Task:\n{task_text}\n\nResult:\n{result_text}\n\nDid this solve the task? Answer yes or no."
            ids = render_ids(tok, [{"role": "user", "content": q}], enable_thinking=False)
            yes, no = tok.encode("yes"), tok.encode("no")
            with torch.no_grad():
                logits = net(torch.tensor([ids]))[0, -1].float()
            pair = torch.log_softmax(logits[[yes[0], no[0]]], -1)
            return float(pair[0].exp())

    def _judge(self, task_text: str, result_text: str) -> float | None:
        import httpx

        j = self.spec.judge
        key = os.environ.get(j["api_key_env"]) if j.get("api_key_env") else None
        prompt = JUDGE_PROMPT.format(rubric=j["rubric"], task=task_text[:8000], result=result_text[:16000])
        body = {"model": j.get("model", "glm-5"), "temperature": 0,
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        try:
            r = httpx.post(j["base_url"].rstrip("/") + "/chat/completions", json=body, timeout=j.get("timeout", 120),
                           headers={"Authorization": f"Bearer {key}"} if key else {})  # fmt: skip
            r.raise_for_status()
            text = r.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            return None
        m = re.findall(r"score\s*[:=]\s*([0-9]*\.?[0-9]+)", text, re.IGNORECASE)
        if not m:
            return None
        return min(1.0, max(0.0, float(m[-1])))
