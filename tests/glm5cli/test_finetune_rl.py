"""`glm5 finetune rl`: GRPO on a tasks file with regex and command rewards end to end (a peft adapter, per-step
log, a merged checkpoint `glm5 serve` loads), and the bad inputs, each named by file and line."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from typer.testing import CliRunner

from finetune.sft import load_adapter
from glm5cli.app import app
from model import GLM5ForCausalLM
from tests.glm5cli.test_finetune_sft import ckpt, kill_and_resume  # noqa: F401 (ckpt: the same peaky checkpoint)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401  (a fixture)

runner = CliRunner(env={"COLUMNS": "300"})


def test_rl_trains_on_checkable_rewards_and_writes_an_adapter_a_log_and_a_checkpoint(ckpt, tmp_path):  # noqa: F811
    tasks = tmp_path / "tasks.jsonl"
    check = f'{sys.executable} -c "import sys; sys.exit(0 if any(c.isdigit() for c in sys.stdin.read()) else 1)"'
    rows = [
        {"prompt": "def f(x):", "reward": {"type": "regex", "pattern": "[0-9]"}},
        {"messages": [{"role": "user", "content": "count"}], "reward": {"type": "command", "run": check}},
        {"prompt": "import os\n"},  # takes --reward
        {"prompt": "# note", "name": "note"},
    ]
    tasks.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "rl"
    args = [
        "finetune",
        "rl",
        str(ckpt),
        "--out",
        str(out),
        "--tasks",
        str(tasks),
        "--reward",
        '{"type": "regex", "pattern": "[0-9]"}',
    ]
    args += ["--steps", "24", "--prompts-per-step", "2", "--group-size", "8", "--max-new-tokens", "6", "--lr", "5e-3"]
    r = runner.invoke(app, [*args, "--rank", "8", "--alpha", "16", "--merge", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["tasks"] == 4 and summary["completions"] == 24 * 2 * 8 and summary["failed_checks"] == 0
    assert summary["reward_first"] < 0.6 and summary["reward_last"] > 0.85, summary
    log = [json.loads(line) for line in (out / "rl_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == list(range(1, 25))
    assert {"reward_mean", "icepop_masked", "mismatch", "groups_with_signal", "pg_grad_norm", "kl_rollout"} <= set(
        log[0]
    )
    assert "loss" not in log[0]  # the on-policy surrogate is 0 by construction: what moves is reported instead
    assert summary["window"] == 5 and summary["pg_grad_norm_mean"] > 0
    # The adapter is peft's, and loads into the base model; the merged checkpoint gives the same logits.
    base = GLM5ForCausalLM.from_pretrained(ckpt)
    adapted = load_adapter(base, out / "adapter")
    merged = GLM5ForCausalLM.from_pretrained(out)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), adapted(ids), atol=1e-4, rtol=1e-4)
    assert not (tmp_path / ".rl.partial").exists()


@pytest.mark.parametrize(
    "text, msg",
    [
        ('{"prompt": "a", "reward": {"type": "regex", "pattern": "x"}}\n{"prompt": \n', "tasks.jsonl:2: not JSON"),
        ('{"prompt": "a"}\n', 'tasks.jsonl:1: no "reward"'),
        ('{"prompt": "a", "reward": "pytest"}\n', 'tasks.jsonl:1: "reward" must be an object'),
        ('{"prompt": "a", "reward": {"type": "llm-judge"}}\n', "tasks.jsonl:1: unknown reward type 'llm-judge'"),
        ('{"prompt": "a", "reward": {"type": "regex", "pattern": "("}}\n', "tasks.jsonl:1: bad reward: bad regex"),
        ('{"prompt": "a", "reward": {"type": "command"}}\n', 'tasks.jsonl:1: bad reward: a "command" reward needs'),
    ],
)
def test_bad_tasks_are_named_by_file_and_line(ckpt, tmp_path, text, msg):  # noqa: F811
    (tmp_path / "tasks.jsonl").write_text(text)
    args = ["finetune", "rl", str(ckpt), "--out", str(tmp_path / "o"), "--tasks", str(tmp_path / "tasks.jsonl")]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and msg in r.output, r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "reward, word",
    [
        ({"type": "command", "run": "true", "sandbox": False}, '"sandbox"'),
        ({"type": "command", "run": "true", "sandbox": True}, '"sandbox"'),
        ({"type": "command", "run": "true", "network": True}, '"network"'),
        ({"type": "command", "run": "true", "timeout": 100000}, '"timeout"'),
        ({"type": "command", "run": "true", "memory_mb": 10**6}, '"memory_mb"'),
        ({"type": "judge", "base_url": "http://evil.example/v1", "api_key_env": "AWS_SECRET_ACCESS_KEY"}, '"base_url"'),
    ],
)
def test_a_task_row_cannot_widen_what_the_user_chose(ckpt, tmp_path, reward, word):  # noqa: F811
    # issue 40, item 3: a row's reward ran its command on the host with the network on, without a word; a row
    # may narrow (a shorter timeout), never turn the sandbox or the network on or off, pick endpoints or keys
    marker = tmp_path / "ran-on-the-host"
    reward = {**reward, "run": f"touch {marker}"} if "run" in reward else reward
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"prompt": "a", "reward": reward}) + "\n")
    args = ["finetune", "rl", str(ckpt), "--out", str(tmp_path / "o"), "--tasks", str(tmp_path / "tasks.jsonl")]
    r = runner.invoke(app, [*args, "--steps", "1", "--prompts-per-step", "1", "--group-size", "2",
                            "--max-new-tokens", "2"])  # fmt: skip
    assert r.exit_code == 2 and "tasks.jsonl:1" in r.output and word in r.output, r.output
    assert "only --reward" in r.output and not marker.exists()
    from finetune.rl.rewards import data_spec_problem

    ok = {"type": "command", "run": "true", "timeout": 5, "memory_mb": 512}  # narrower than the defaults: fine
    assert data_spec_problem(ok, None) is None
    assert data_spec_problem({**ok, "timeout": 50}, {"type": "command", "run": "x", "timeout": 30}) is not None


def test_bad_options_are_usage_errors(ckpt, tmp_path):  # noqa: F811
    (tmp_path / "t.jsonl").write_text('{"prompt": "a"}\n')
    base = ["finetune", "rl", str(ckpt), "--out", str(tmp_path / "o"), "--tasks", str(tmp_path / "t.jsonl")]
    r = runner.invoke(app, [*base, "--reward", "{not json"])
    assert r.exit_code == 2 and "--reward is not JSON" in r.output
    r = runner.invoke(app, [*base, "--group-size", "1"])
    assert r.exit_code == 2
    r = runner.invoke(app, [*base[:2], str(tmp_path), *base[3:]])
    assert r.exit_code == 1 and "not a checkpoint directory" in r.output


def test_rl_resumes_exactly_after_a_kill(ckpt, tmp_path, monkeypatch):  # noqa: F811
    import finetune.grpo as grpo

    (tmp_path / "t.jsonl").write_text('{"prompt": "def f(x):"}\n{"prompt": "class A:"}\n')
    opts = ["--tasks", str(tmp_path / "t.jsonl"), "--reward", '{"type": "regex", "pattern": "[0-9]"}']
    opts += ["--steps", "5", "--save-every", "2", "--prompts-per-step", "2", "--group-size", "4"]
    opts += ["--max-new-tokens", "4", "--lr", "5e-3", "--rank", "4"]
    whole, out = kill_and_resume("rl", ckpt, opts, grpo, "train_grpo", 5, tmp_path, monkeypatch)
    assert (whole / "rl_log.jsonl").read_text() == (out / "rl_log.jsonl").read_text()


def test_a_reward_command_that_cannot_run_fails_the_run_with_its_error(ckpt, tmp_path):  # noqa: F811
    (tmp_path / "t.jsonl").write_text('{"prompt": "def f(x):"}\n')
    args = ["finetune", "rl", str(ckpt), "--out", str(tmp_path / "o"), "--tasks", str(tmp_path / "t.jsonl")]
    args += ["--reward", '{"type": "command", "run": "no-such-checker-cmd"}', "--steps", "2", "--group-size", "2"]
    r = runner.invoke(app, [*args, "--prompts-per-step", "1", "--max-new-tokens", "2"])
    assert r.exit_code == 1, r.output
    assert "no completion could be scored" in r.output and "no-such-checker-cmd" in r.output, r.output
    assert "not found" in r.output and not (tmp_path / "o").exists()


def test_agentic_rl_on_the_scripted_family_writes_an_adapter_and_a_log(ckpt, tmp_path):  # noqa: F811
    out = tmp_path / "agentic"
    args = ["finetune", "rl", str(ckpt), "--out", str(out), "--env", "scripted", "--steps", "3", "--group-size", "4"]
    args += ["--groups-per-step", "2", "--max-new-tokens", "5", "--max-turns", "2", "--max-model-len", "512"]
    args += ["--save-every", "2"]
    r = runner.invoke(app, [*args, "--lr", "5e-3", "--rank", "4", "--max-staleness", "1", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["env"] == "scripted" and summary["steps"] == 3 and summary["window"] == 1
    log = [json.loads(line) for line in (out / "rl_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in log] == [1, 2, 3]
    steps = [line for line in r.stderr.splitlines() if line.startswith("RL (scripted), reward")]  # a log's lines
    assert [line.split(": ")[-1].split(" ")[0] for line in steps] == ["1/3", "2/3", "3/3"], r.stderr
    want = {"reward_mean", "reward_std", "solved_rate", "groups_kept", "groups_dropped", "dropped_by_reason",
            "staleness_hist", "is_masked", "mismatch", "kl_rollout", "pg_grad_norm", "rollout_tokens_per_s",
            "train_tokens_per_s", "server_idle_s", "trainer_idle_s"}  # fmt: skip
    assert want <= set(log[0]), want - set(log[0])
    assert all(int(lag) <= 1 for row in log for lag in row["staleness_hist"])
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert not (out / "rollouts").exists() and not (out / "state.pt").exists()
    load_adapter(GLM5ForCausalLM.from_pretrained(ckpt), out / "adapter")  # it loads onto its base
    # --save-every 2: the adapters of step 2 and of the last step, each loadable onto the base (servable)
    assert summary["step_adapters"] == [str(out / "adapters" / "step-2"), str(out / "adapters" / "step-3")]
    assert sorted(p.name for p in (out / "adapters").iterdir()) == ["step-2", "step-3"]
    last = load_adapter(GLM5ForCausalLM.from_pretrained(ckpt), out / "adapters" / "step-3")
    final = load_adapter(GLM5ForCausalLM.from_pretrained(ckpt), out / "adapter")
    a = {n: p for n, p in last.named_parameters() if "lora" in n}
    b = {n: p for n, p in final.named_parameters() if "lora" in n}
    assert a and all(torch.equal(a[n], b[n]) for n in a)  # step-3 is the final adapter


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--env", "nope"], "--env must be one of"),
        (["--env", "swe"], "--env swe needs --tasks"),
        (["--env", "terminal"], "--env terminal needs task folders"),
        (["--env", "scripted", "--is-low", "1.5"], "is_low must be in [0, 1)"),
        (["--env", "scripted", "--objective", "ppo"], "objective must be one of"),
        (["--env", "scripted", "--dynamic-sampling", "-1"], "dynamic-sampling"),
        (["--env", "scripted", "--loss-agg", "seq"], "loss_agg must be one of"),
        (["--env", "scripted", "--refusal-penalty", "-1"], "refusal-penalty"),
        (["--env", "scripted", "--negative-weight", "2"], "negative-weight"),
        (["--env", "scripted", "--rollout-engine", "gpu"], "--rollout-engine must be thread or process"),
        (["--env", "scripted", "--quant", "int8"], "--quant must be int4"),
        (["--env", "completion", "--tasks", "t.jsonl", "--quant", "int4"], "--quant is for agentic RL"),
        (["--env", "scripted", "--rollout-engine", "thread", "--rollout-url", "http://h:1"], "pick one"),
        (["--env", "swe", "--tasks", "t.jsonl", "--reward", '{"judge": {"rubric": "x"}}'], '"judge" needs'),
    ],
)
def test_bad_agentic_options_are_usage_errors(ckpt, tmp_path, monkeypatch, extra, msg):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text("")
    r = runner.invoke(app, ["finetune", "rl", str(ckpt), "--out", str(tmp_path / "o"), *extra])
    assert r.exit_code == 2 and msg in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_held_out_tasks_must_be_bench_tasks_disjoint_from_the_training_tasks(ckpt, tmp_path):  # noqa: F811
    from plugins.bench_suites.swe_suite import SWESuite

    [jsonl] = SWESuite().materialize(tmp_path / "suite")
    base = ["finetune", "rl", str(ckpt), "--out", str(tmp_path / "o")]
    r = runner.invoke(app, [*base, "--env", "scripted", "--eval-tasks", str(jsonl)])
    assert r.exit_code == 2 and "--eval-tasks is for --env swe / terminal" in r.output, r.output
    r = runner.invoke(app, [*base, "--env", "swe", "--tasks", str(jsonl), "--eval-tasks", str(jsonl)])
    assert r.exit_code == 2 and "held-out task(s) are also training tasks" in r.output, r.output
    r = runner.invoke(app, [*base, "--env", "swe", "--tasks", str(jsonl), "--eval-tasks", str(tmp_path / "no.jsonl")])
    assert r.exit_code == 2 and "--eval-tasks" in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_agentic_rl_quant_int4_records_the_checkpoints_weights_and_int4_beside_its_adapters(ckpt, tmp_path):  # noqa: F811
    """`--quant int4` rounds the trainer's frozen weights (said on stderr), yet the adapters (final and per step)
    record the checkpoint's own weights as their base (they load onto it without a warning) and `quant: int4`,
    which `glm5 serve --lora` reads; the merged checkpoint is the checkpoint's own weights plus the adapter (not
    the rounded ones: weights left on INT4's grid would lose a later stage's small updates when served INT4)."""
    import warnings

    from finetune.lora import trained_quant, weights_fingerprint
    from model.quant_int4 import round_like_int4

    out = tmp_path / "q"
    args = ["finetune", "rl", str(ckpt), "--out", str(out), "--env", "scripted", "--steps", "1", "--group-size", "2"]
    args += ["--groups-per-step", "1", "--max-new-tokens", "3", "--max-turns", "1", "--max-model-len", "256"]
    args += ["--rollout-engine", "thread", "--quant", "int4", "--save-every", "1", "--merge", "--lr", "5e-2"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "linears rounded as INT4 serving rounds them" in r.output and "--quant int4 --lora" in r.output
    base = GLM5ForCausalLM.from_pretrained(ckpt)
    for adapter in (out / "adapter", out / "adapters" / "step-1"):
        assert trained_quant(adapter) == "int4"
        record = json.loads((adapter / "adapter_base.json").read_text())
        assert record["weights_fingerprint"] == weights_fingerprint(base)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_adapter(GLM5ForCausalLM.from_pretrained(ckpt), adapter)
    from finetune.lora import merge_lora

    rounded = round_like_int4(base)
    assert rounded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rounded weights are not the recorded base
        on_grid = merge_lora(load_adapter(base, out / "adapter"))
    merged = GLM5ForCausalLM.from_pretrained(out)
    want = merge_lora(load_adapter(GLM5ForCausalLM.from_pretrained(ckpt), out / "adapter"))
    for n in rounded:
        w = merged.get_parameter(n + ".weight")
        assert torch.allclose(w, want.get_parameter(n + ".weight"), atol=1e-6), n
        assert not torch.allclose(w, on_grid.get_parameter(n + ".weight"), atol=1e-6), n  # not the rounded merge
