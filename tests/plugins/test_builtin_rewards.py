"""The built-in RL rewards: regex and command (exit code, score, timeout, a checker that cannot run), their
spec errors, and that the plugin manager offers them as a third-party plugin's would be."""

from __future__ import annotations

import sys

import pytest

from agent.plugin_registry import PluginManager
from plugins.builtin_rewards import register_rewards

REWARDS: dict = {}
register_rewards(lambda name, make: REWARDS.__setitem__(name, make), None)


def test_the_plugin_manager_offers_the_built_in_rewards():
    assert {"regex", "command"} <= set(PluginManager(entry_points=False).rewards())


def test_regex_reward():
    score = REWARDS["regex"]({"type": "regex", "pattern": r"return \w+"})
    assert score("def f():\n    return x\n") == 1.0
    assert score("def f():\n    pass\n") == 0.0
    assert REWARDS["regex"]({"type": "regex", "pattern": "ok", "ignore_case": True})("OK") == 1.0


@pytest.mark.parametrize(
    "spec, msg",
    [({"type": "regex"}, 'needs "pattern"'), ({"type": "regex", "pattern": "("}, "bad regex")],
)
def test_bad_regex_specs_are_named(spec, msg):
    with pytest.raises(ValueError, match=msg):
        REWARDS["regex"](spec)


def test_command_reward_sees_the_completion_and_scores_by_exit_code(tmp_path):
    py = sys.executable
    # The completion arrives on stdin and as $GLM5_COMPLETION; exit 0 scores 1.
    check = f"{py} -c \"import os,sys; t=sys.stdin.read(); assert t == open(os.environ['GLM5_COMPLETION']).read(); sys.exit(0 if 'pass' in t else 3)\""
    score = REWARDS["command"]({"type": "command", "run": check})
    assert score("all tests pass") == 1.0
    assert score("2 failed") == 0.0


def test_command_reward_score_mode_timeout_and_a_checker_that_cannot_run():
    py = sys.executable
    score = REWARDS["command"](
        {"type": "command", "run": f"{py} -c \"print('log'); print(len(input()) / 10)\"", "score": True}
    )
    assert score("abcde\n") == 0.5
    hang = REWARDS["command"]({"type": "command", "run": f'{py} -c "import time; time.sleep(30)"', "timeout": 0.5})
    assert hang("x") == 0.0  # the completion made the check hang: the model's fault
    missing = REWARDS["command"]({"type": "command", "run": "no-such-checker-xyz --flag"})
    assert missing("x") is None  # the environment's fault: left out, not scored 0
    unreadable = REWARDS["command"]({"type": "command", "run": "echo not-a-number", "score": True})
    assert unreadable("x") is None


@pytest.mark.parametrize(
    "spec, msg",
    [
        ({"type": "command"}, 'needs "run"'),
        ({"type": "command", "run": "true", "timeout": 0}, "timeout"),
        ({"type": "command", "run": "true", "cwd": "/no/such/dir"}, "not a directory"),
    ],
)
def test_bad_command_specs_are_named(spec, msg):
    with pytest.raises(ValueError, match=msg):
        REWARDS["command"](spec)
