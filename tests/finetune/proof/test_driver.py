"""The proof driver: the plan, resume (done steps skipped), a failing step stops what needs it, the config pinned,
the stage table from run folders, and (slow) the first steps for real: the family, the expert through the bench,
the corpus read as training data."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from finetune.proof.commands import bench_cmd, shown
from finetune.proof.config import ProofConfig, ProofConfigMismatch, claim
from finetune.proof.driver import Step, run_proof, run_steps
from finetune.proof.measure import StageFailed, spec_metrics
from finetune.proof.table import markdown, stage_row, write_table


def test_the_plan_lists_every_step_with_its_glm5_command(tmp_path):
    plan = run_proof(tmp_path / "run", ProofConfig.smoke(), plan=True)["plan"]
    names = [p["step"] for p in plan]
    assert names == ["tasks", "expert", "corpus", "init", "base-copy", "base-dense", "base", "measure-base", "sft",
                     "measure-sft", "compare-sft", "rl", "measure-rl", "compare-rl", "forget", "measure-forget",
                     "compare-forget", "distill", "measure-distill", "compare-distill"]  # fmt: skip
    by = {p["step"]: p["command"] for p in plan}
    assert not any(p["done"] for p in plan) and not (tmp_path / "run").exists()  # a plan writes nothing
    assert by["init"].startswith("glm5 model init --preset tiny")
    # the base: a copy phase on made-up names from scratch, dense pretraining on the corpus and the copy drills
    # from there, then DSA by the indexers' warm-up
    assert "/models/init " in by["base-copy"] and "corpus/copy.jsonl" in by["base-copy"]
    assert "--dense-attention" in by["base-copy"] and "--pack" in by["base-copy"]
    assert "/models/base-copy " in by["base-dense"] and "--dense-attention" in by["base-dense"]
    assert "corpus/drill.jsonl" in by["base-dense"] and "--pack" in by["base-dense"]
    assert by["base"].startswith("glm5 finetune dsa-warmup ") and "/models/base-dense " in by["base"]
    assert "finetune sft" in by["sft"] and "/models/base " in by["sft"] and "--only-resolved" in by["sft"]
    assert by["rl"].startswith("glm5 finetune rl") and "--env swe" in by["rl"] and "repair-train.jsonl" in by["rl"]
    assert "--merge" in by["rl"] and "--max-new-tokens 256" in by["rl"]
    assert "--no-thinking" in by["rl"].split()  # trained without reasoning, rolled out without it
    # the proof deploys INT4: RL trains its adapter on SFT's INT4 weights, the policy the bench then serves
    assert " --quant int4 " in by["rl"] + " "
    # RL evaluates itself on the dev split (held-out names, instances of its own), never on held-out
    assert "--eval-tasks " + str(tmp_path / "run" / "tasks" / "dev" / "repair-dev.jsonl") in by["rl"]
    assert "repair-heldout" not in by["rl"] and "--eval-samples 2" in by["rl"]
    assert "--dynamic-sampling" not in by["rl"]  # off in the smoke setting
    assert "--dynamic-sampling 3" in {p["step"]: p["command"] for p in run_proof(
        tmp_path / "ds", ProofConfig.smoke(rl_dynamic_sampling=3), plan=True)["plan"]}["rl"]  # fmt: skip
    assert "/models/rl " in by["forget"] and "corpus/forget.jsonl" in by["forget"] and "--full" in by["forget"]
    # distillation: forget's model is the student, the stage before forget the teacher, the train sessions' turns
    assert by["distill"].startswith("glm5 finetune distill ") and "/models/forget --teacher " in by["distill"]
    assert "--teacher " + str(tmp_path / "run" / "models" / "rl") + " " in by["distill"]
    assert "corpus/distill.jsonl" in by["distill"] and "--full" in by["distill"]
    assert "/bench/forget " in by["compare-distill"] and "/bench/distill " in by["compare-distill"]
    # every session the proof records, trains on or measures uses the compact agent profile
    assert "--agent-profile compact" in by["expert"]
    assert "--agent-profile compact" in shown(bench_cmd(tmp_path, "base", ProofConfig.smoke(), "URL", "KEY"))
    # every stage's bench meets the same random draws (the run's seed), so `bench compare` pairs like with like
    assert "--seed 3 " in shown(bench_cmd(tmp_path, "rl", ProofConfig.smoke(seed=3), "URL", "KEY"))
    # RL is served as SFT's checkpoint with RL's adapter, as its curve's points are: merged and rounded to INT4
    # again, the rounding would move every weight further than RL did
    assert by["measure-rl"].startswith(f"glm5 serve {tmp_path / 'run' / 'models' / 'sft'} --lora ")
    assert f"--lora {tmp_path / 'run' / 'models' / 'rl' / 'adapter'} " in by["measure-rl"]
    assert by["measure-sft"].startswith(f"glm5 serve {tmp_path / 'run' / 'models' / 'sft'} + ")
    plan = run_proof(tmp_path / "run", ProofConfig.smoke(stages=("base", "sft", "forget", "distill")), plan=True)
    assert "--teacher " + str(tmp_path / "run" / "models" / "sft") + " " in {p["step"]: p["command"] for p in
                                                                           plan["plan"]}["distill"]  # fmt: skip
    # the full proof's model: tiny grown, with a DSA top-k below the session length
    full = {p["step"]: p["command"] for p in run_proof(tmp_path / "full", ProofConfig(), plan=True)["plan"]}
    assert "--set index_topk=512" in full["init"] and "--set hidden_size=128" in full["init"]
    assert "-k 4" in full["measure-base"]
    assert (
        full["rl-sync"].endswith("--sync")
        and "/models/rl-sync " in full["rl-sync"]
        and "/models/sft " in full["rl-sync"]
        and "--eval-tasks" not in full["rl-sync"]  # its curve is the per-step rewards: no dev evaluations
        and "--eval-samples" not in full["rl-sync"]
    )
    assert list(full)[-1] == "rl-sync"  # the baseline's curve comes after every measurement
    # without the copy phase the dense base starts from scratch
    plan = run_proof(tmp_path / "run", ProofConfig.smoke(copy_steps=0), plan=True)["plan"]
    assert "base-copy" not in [p["step"] for p in plan]
    assert "/models/init " in {p["step"]: p["command"] for p in plan}["base-dense"]
    # an ablation without the base stage fine-tunes the random init
    plan = run_proof(tmp_path / "run", ProofConfig.smoke(stages=("sft",)), plan=True)["plan"]
    assert "/models/init " in {p["step"]: p["command"] for p in plan}["sft"]


def test_done_steps_are_skipped_and_a_failure_stops_the_steps_that_need_it():
    ran, outputs = [], set()

    def step(name, fail=False):
        def run():
            ran.append(name)
            if fail:
                raise StageFailed(f"{name}: the command exited with 1 (log: logs/{name}.log)")
            outputs.add(name)

        return Step(name, f"glm5 {name}", lambda: name in outputs, run)

    events = []
    statuses = run_steps([step("a"), step("b", fail=True), step("c")], lambda k, d: events.append(k))
    assert [s["status"] for s in statuses] == ["done", "failed", "not run"]
    assert "logs/b.log" in statuses[1]["reason"] and statuses[2]["reason"] == "needs b"
    assert ran == ["a", "b"] and events == ["start", "done", "start", "fail"]
    # the rerun (b fixed) skips a and goes on
    statuses = run_steps([step("a"), step("b"), step("c")], lambda k, d: None)
    assert [s["status"] for s in statuses] == ["done before", "done", "done"] and ran == ["a", "b", "b", "c"]
    # a step done before keeps an earlier invocation's time; `record` sees the statuses after every step
    seen = []
    statuses = run_steps([step("a"), step("e")], lambda k, d: None, {"a": 12.5}, lambda st: seen.append(list(st)))
    assert statuses[0] == {"step": "a", "status": "done before", "seconds": 12.5}
    assert statuses[1]["status"] == "done" and [len(x) for x in seen] == [1, 2]
    # a step whose command "succeeds" without leaving its output is a failure, not a silent skip later
    statuses = run_steps([Step("d", "glm5 d", lambda: False, lambda: None)], lambda k, d: None)
    assert statuses[0]["status"] == "failed" and "output is not there" in statuses[0]["reason"]


def test_a_resumed_run_must_ask_for_the_same_configuration(tmp_path):
    claim(tmp_path, ProofConfig.smoke())
    claim(tmp_path, ProofConfig.smoke())  # the same: fine
    with pytest.raises(ProofConfigMismatch, match=r"sft_steps: 1 -> 5"):
        claim(tmp_path, ProofConfig.smoke(sft_steps=5))
    claim(tmp_path, ProofConfig.smoke(sft_steps=5), force=True)
    assert json.loads((tmp_path / "proof.json").read_text())["sft_steps"] == 5  # force records the new one
    # a folder from an older glm5 lacks the settings added since: not taken for today's defaults
    stored = json.loads((tmp_path / "proof.json").read_text())
    del stored["copy_steps"]
    (tmp_path / "proof.json").write_text(json.dumps(stored))
    with pytest.raises(ProofConfigMismatch, match=r"copy_steps: not recorded -> 1"):
        claim(tmp_path, ProofConfig.smoke(sft_steps=5))
    with pytest.raises(ValueError, match="unknown stage"):
        ProofConfig(stages=("base", "dpo"))
    with pytest.raises(ValueError, match="in the order"):
        ProofConfig(stages=("rl", "sft"))
    with pytest.raises(ValueError, match="distill needs forget before it"):
        ProofConfig(stages=("base", "sft", "distill"))
    with pytest.raises(ValueError, match="agent_profile 'tiny'"):
        ProofConfig(agent_profile="tiny")


def test_the_pinned_thread_count_reaches_every_subprocess(tmp_path, monkeypatch):
    from finetune.proof.measure import child_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    claim(tmp_path / "a", ProofConfig.smoke())
    assert "OMP_NUM_THREADS" not in child_env(tmp_path / "a")  # 0: torch's default
    claim(tmp_path / "b", ProofConfig.smoke(threads=1))
    assert child_env(tmp_path / "b")["OMP_NUM_THREADS"] == "1"
    with pytest.raises(ValueError, match="threads must be >= 0"):
        ProofConfig(threads=-1)


def _bench(folder, resolved, graded, ci, k=4, steps=(3, 5)):
    folder.mkdir(parents=True)
    summary = {"tasks": graded // k, "trials": graded, "graded": graded, "resolved": resolved,
               "resolved_rate": resolved / graded, "resolved_rate_ci95": ci, "pass@1": resolved / graded,
               f"pass@{k}": 0.5, "tokens_per_trial": 2100.0}  # fmt: skip
    (folder / "report.json").write_text(json.dumps({"k": k, "complete": True, "summary": summary}))
    (folder / "results.jsonl").write_text("".join(json.dumps({"steps": s}) + "\n" for s in steps))


def test_the_stage_table_reads_the_run_folder(tmp_path):
    _bench(tmp_path / "bench" / "base", 0, 8, [0.0, 0.324])
    _bench(tmp_path / "bench" / "sft", 6, 8, [0.409, 0.929])
    (tmp_path / "bench" / "sft.serve.json").write_text(json.dumps({"spec_accept_rate": 0.625}))
    diff = {"difference": {"mean_difference": 0.75, "ci95": [0.4, 1.0]}}
    (tmp_path / "bench" / "compare-sft.json").write_text(json.dumps(diff))
    row = stage_row(tmp_path, "sft")
    assert row["mean_turns"] == 4 and row["mtp_accept_rate"] == 0.625 and row["pass@4"] == 0.5
    assert stage_row(tmp_path, "rl") is None
    body = write_table(tmp_path, ("base", "sft", "rl"))
    md = (tmp_path / "table.md").read_text()
    assert [r["stage"] for r in body["stages"]] == ["base", "sft"]
    assert (
        "| sft | 6/8 = 75.0% (40.9%-92.9%) | 75.0% | 50.0% | 4.00 | 2100 | 62.5% | +75.0 pts (+40.0 to +100.0) |" in md
    )
    assert "| base | 0/8 = 0.0%" in md and "pass@4" in md
    assert body["note"].startswith("plots") and json.loads((tmp_path / "table.json").read_text())["stages"]
    if body["plots"]:  # matplotlib installed
        assert (tmp_path / "plots" / "stages.png").stat().st_size > 0
    else:
        assert "matplotlib is not installed" in body["note"]
    assert markdown([]).count("\n") == 2


def test_rl_is_also_measured_at_its_step_adapters_through_glm5_bench(tmp_path):
    """The learning curve through `glm5 bench`: RL keeps every rl_curve_every-th adapter, and each is served on
    the stage RL started from (`--lora`) and benched on held-out like a stage; the table reads the points."""
    c = ProofConfig.smoke(rl_steps=5, rl_curve_every=2)
    plan = {p["step"]: p["command"] for p in run_proof(tmp_path / "run", c, plan=True)["plan"]}
    assert "--save-every 2" in plan["rl"]
    names = list(plan)
    assert names.index("measure-rl") < names.index("measure-rl-step-2") < names.index("measure-rl-step-4") < \
        names.index("forget")  # fmt: skip
    assert "measure-rl-step-5" not in plan  # the last step is RL's own measurement
    assert f"{tmp_path / 'run' / 'models' / 'sft'} --lora {tmp_path / 'run' / 'models' / 'rl' / 'adapters' / 'step-2'}" \
        in plan["measure-rl-step-2"]  # fmt: skip
    assert "--save-every" not in {p["step"]: p["command"] for p in run_proof(
        tmp_path / "none", ProofConfig.smoke(rl_steps=5, rl_curve_every=0), plan=True)["plan"]}["rl"]  # fmt: skip
    for name, resolved in (("sft", 1), ("rl-step-2", 3), ("rl", 5)):  # step 4 not measured yet: left out
        _bench(tmp_path / "t" / "bench" / name, resolved, 8, [0.1, 0.9])
    body = write_table(tmp_path / "t", c.stages, c)
    curve = [(p["step"], p["measured"], p["resolved"]) for p in body["rl_heldout_curve"]]
    assert curve == [(0, "sft", 1), (2, "rl-step-2", 3), (5, "rl", 5)]
    assert "step 0 1/8, step 2 3/8, step 5 5/8" in body["note"]
    if body["plots"]:
        assert (tmp_path / "t" / "plots" / "rl_heldout.png").stat().st_size > 0
    with pytest.raises(ValueError, match="rl_curve_every"):
        ProofConfig.smoke(rl_curve_every=-1)
    with pytest.raises(ValueError, match="rl_eval_samples"):
        ProofConfig.smoke(rl_eval_samples=1)


def test_the_table_shows_rls_dev_curve_from_its_log(tmp_path):
    rows = [{"step": 1, "reward_mean": 0.5, "solved_rate": 0.5, "eval_before": {"eval_solved_rate": 0.3}},
            {"step": 2, "reward_mean": 1.0, "solved_rate": 1.0, "drawn_reward_mean": 0.25, "drawn_solved_rate": 0.25,
             "eval_solved_rate": 0.4}]  # fmt: skip
    (tmp_path / "models" / "rl").mkdir(parents=True)
    (tmp_path / "models" / "rl" / "rl_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    body = write_table(tmp_path, ("sft", "rl"))
    assert body["rl_dev_curve"] == {"rl": [[0, 0.3], [2, 0.4]]}
    assert "RL on dev tasks (its in-run evaluation, not the measurement): rl step 0 30%, step 2 40%" in body["note"]
    if body["plots"]:
        assert (tmp_path / "plots" / "rl_curves.png").stat().st_size > 0


def test_a_step_adapter_with_the_last_steps_weights_is_not_benched_again(tmp_path, monkeypatch):
    """When no step after K had a group with signal, step K's adapter is the last step's: its held-out point is
    RL's own measurement (marked, not a second bench run); an adapter that differs is served and benched."""
    from finetune.proof import driver

    c = ProofConfig.smoke(rl_steps=6, rl_curve_every=3)
    run = tmp_path / "run"
    for step, data in ((3, b"same"), (6, b"same")):
        (run / "models" / "rl" / "adapters" / f"step-{step}").mkdir(parents=True)
        (run / "models" / "rl" / "adapters" / f"step-{step}" / "adapter_model.safetensors").write_bytes(data)
    served = []
    monkeypatch.setattr(driver, "serve_and_bench", lambda run, name, c, log, **kw: served.append((name, kw["lora"])))
    driver.measure_rl_step(run, 3, c, print, run / "models" / "sft")
    assert served == [] and json.loads((run / "bench" / "rl-step-3.same.json").read_text())["same_weights_as_step"] == 6
    for name, resolved in (("sft", 1), ("rl", 5)):
        _bench(run / "bench" / name, resolved, 8, [0.1, 0.9])
    body = write_table(run, c.stages, c)
    assert [(p["step"], p["measured"], p["resolved"]) for p in body["rl_heldout_curve"]] == [
        (0, "sft", 1), (3, "rl", 5), (6, "rl", 5)]  # fmt: skip
    assert "step 3 5/8 (step 6's weights)" in body["note"]
    (run / "models" / "rl" / "adapters" / "step-3" / "adapter_model.safetensors").write_bytes(b"other")
    driver.measure_rl_step(run, 3, c, print, run / "models" / "sft")
    assert served == [("rl-step-3", run / "models" / "rl" / "adapters" / "step-3")]


def test_spec_counters_are_read_from_prometheus_text():
    text = ('# HELP glm5:spec_accept_rate Share.\n# TYPE glm5:spec_accept_rate gauge\n'
            'glm5:spec_accept_rate{model_name="glm5-proof"} 0.4\nglm5:spec_draft_tokens_total 30\n'
            'glm5:num_requests_running 1\n')  # fmt: skip
    assert spec_metrics(text) == {"spec_accept_rate": 0.4, "spec_draft_tokens_total": 30.0}


def test_the_cli_prints_the_plan_and_refuses_bad_settings(tmp_path):
    from glm5cli.app import app

    runner = CliRunner()
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "run"), "--smoke", "--plan", "--json"])
    assert r.exit_code == 0, r.output
    assert [p["step"] for p in json.loads(r.output)["plan"]][:4] == ["tasks", "expert", "corpus", "init"]
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "run"), "--stages", "base,dpo"])
    assert r.exit_code == 2 and "unknown stage" in r.output
    r = runner.invoke(
        app, ["bench", "proof", "--out", str(tmp_path / "s"), "--expert-slips", "0.2", "--plan", "--json"]
    )
    assert r.exit_code == 0 and "fails an edit on 20% of the tasks" in json.loads(r.output)["plan"][1]["command"]
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "s"), "--expert-slips", "2", "--plan"])
    assert r.exit_code == 2
    # a long RL with a sparse curve: one held-out point between SFT and RL's own measurement, not seven
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "c"), "--rl-steps", "32", "--rl-curve-every",
                            "16", "--plan", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    plan = {p["step"]: p["command"] for p in json.loads(r.output)["plan"]}
    assert [s for s in plan if s.startswith("measure-rl-step")] == ["measure-rl-step-16"]
    assert "--steps 32" in plan["rl"] and "--save-every 16" in plan["rl"]
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "c"), "--rl-curve-every", "-1", "--plan"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "d"), "--drill-numbers", "1.5", "--plan"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "d"), "--drill-numbers", "0.2", "--plan",
                            "--json"])  # fmt: skip
    plan = {p["step"]: p["command"] for p in json.loads(r.output)["plan"]}
    assert "20% of them comparison lines" in plan["corpus"]
    assert "comparison" not in {p["step"]: p["command"] for p in json.loads(runner.invoke(
        app, ["bench", "proof", "--out", str(tmp_path / "e"), "--drill-numbers", "0", "--plan", "--json"]
    ).output)["plan"]}["corpus"]  # fmt: skip
    assert ProofConfig().drill_numbers == 0.2  # the default since p18 (benchmarks/RESULTS.md)
    for flag in ("--rl-steps", "--sft-steps", "--base-steps", "--train"):  # a stage of no steps is a typo
        r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "f"), flag, "0", "--plan"])
        assert r.exit_code == 2 and "must be >= 1" in r.output, (flag, r.output)
    (tmp_path / "a-file").write_text("")
    r = runner.invoke(app, ["bench", "proof", "--out", str(tmp_path / "a-file"), "--plan"])
    assert r.exit_code == 2 and "is a file" in r.output


@pytest.mark.slow
def test_the_first_steps_for_real_family_expert_through_the_bench_corpus(tmp_path, monkeypatch):
    from finetune.data.sources import load_sequences
    from finetune.data.trajectories import DataOptions
    from finetune.proof.expert import slips_for
    from model.tokenizer import _shipped
    from plugins.bench_suites.repair_family import name_pool

    run = tmp_path / "run"
    summary = run_proof(run, ProofConfig.smoke(n_train=1, stages=(), preset="tiny"))
    assert summary["complete"], summary["steps"]
    assert [s["step"] for s in summary["steps"]] == ["tasks", "expert", "corpus", "init"]
    toml = (run / "config" / "config.toml").read_text()
    assert "max_tokens = 256" in toml  # every stage's response cap
    assert "enable_thinking = false" in toml  # served as trained: `<|assistant|></think>`
    report = json.loads((run / "expert" / "report.json").read_text())
    assert report["summary"]["resolved"] == 1  # the expert solved its train task through the real agent loop
    monkeypatch.setenv("GLM5_CONFIG_DIR", str(run / "config"))  # the run's commands' config: its provenance key
    seqs, data = load_sequences([run / "expert"], _shipped(), DataOptions(only_resolved=True))
    assert len(seqs) == 1 and seqs[0].targets > 50  # what `finetune sft --data RUN/expert` trains on
    # this task is one the expert slips on (expert_slips 0.5): its failed edits went through the real agent
    # loop, were recorded as refused (a failed call, or a format error for an edit without its path), and are
    # context, not targets
    (traj,) = (run / "expert" / "trials").rglob("trajectory.jsonl")
    recs = [json.loads(line) for line in traj.read_text().splitlines()]
    issue = next(r["message"]["content"] for r in recs if r["type"] == "message" and r["message"]["role"] == "user")
    slips = slips_for(issue, ProofConfig().expert_slips)
    edits = [r for r in recs if r["type"] == "tool" and r["name"] == "edit"]
    outcome = ["failed" if r.get("failed") == "call" else r["decision"] for r in edits]
    assert slips > 0 and len(edits) == slips + 1 and outcome[-1] == "allow", outcome
    assert all(o in ("failed", "format_error") for o in outcome[:-1]), outcome
    assert sum(data.filtered.values()) == slips and all("(context, not trained)" in k for k in data.filtered)
    seqs, _ = load_sequences([run / "corpus" / "chat.jsonl"], _shipped(), DataOptions())
    assert len(seqs) == 8 and all(s.targets > 0 for s in seqs)
    renames = [json.loads(line) for line in (run / "corpus" / "forget.jsonl").read_text().splitlines()]
    assert len(renames) == 4 and all("rename" in r["messages"][1]["content"] for r in renames)
    drills = [json.loads(line)["messages"] for line in (run / "corpus" / "drill.jsonl").read_text().splitlines()]
    assert len(drills) == 8 and all(f"`{x}`" in d[0]["content"] for d in drills for x in d[1]["content"].split("\n"))
    # the copy phase's drills: every one quotes its answer, and none names a function of either split
    copies = [json.loads(line)["messages"] for line in (run / "corpus" / "copy.jsonl").read_text().splitlines()]
    assert len(copies) == 8 and all(f"`{x}`" in d[0]["content"] for d in copies for x in d[1]["content"].split("\n"))
    words = {w for d in copies for w in re.findall(r"\w+", d[1]["content"])}
    assert words and not words & {*name_pool("train"), *name_pool("heldout")}
    again = run_proof(run, ProofConfig.smoke(n_train=1, stages=(), preset="tiny"))
    assert {s["status"] for s in again["steps"]} == {"done before"}
    # the rerun keeps each step's time from the first run: the end-to-end time of a resumed run
    assert [s["seconds"] for s in again["steps"]] == [s["seconds"] for s in summary["steps"]]
    assert again["seconds"] == summary["seconds"] > 0 and again["untimed"] == []
    # the sessions were recorded with the compact profile: the corpus copies its prompt, four tools
    assert len(json.loads((run / "corpus" / "chat.jsonl").read_text().splitlines()[0])["tools"]) == 4

    # the distillation stage for real, with the random init standing in for sft (the teacher) and forget
    import shutil

    from finetune.proof.driver import build_steps

    for stage in ("sft", "forget"):
        shutil.copytree(run / "models" / "init", run / "models" / stage)
    # 16 new tokens: the random init never stops, and one step's sampling is what costs here
    c = ProofConfig.smoke(n_train=1, stages=("sft", "forget", "distill"), max_response_tokens=16)
    steps = {s.name: s for s in build_steps(run, c, print)}
    assert not steps["distill"].done()
    steps["distill"].run()
    assert steps["distill"].done()  # a servable checkpoint in RUN/models/distill
    prompts = [json.loads(line) for line in (run / "corpus" / "distill.jsonl").read_text().splitlines()]
    # one context per turn of the expert's session (read, the slips, edit, bash, answer), each the one before it
    # extended by that turn's call and its result: the student relearns the edit, written after the file's listing
    assert len(prompts) == 4 + slips and [m["role"] for m in prompts[0]["messages"]] == ["system", "user"]
    assert ".py::" in prompts[0]["messages"][1]["content"]  # the issue, naming its failing test
    for before, after in zip(prompts, prompts[1:], strict=False):
        assert after["messages"][: len(before["messages"])] == before["messages"]
        assert [m["role"] for m in after["messages"][len(before["messages"]) :]] == ["assistant", "tool"]
    calls = [m["tool_calls"][0]["function"]["name"] for m in prompts[-1]["messages"] if m.get("tool_calls")]
    assert calls == ["read"] + ["edit"] * (slips + 1) + ["bash"]
    assert all(p["chat_template_kwargs"] == {"enable_thinking": False} for p in prompts)
    log = json.loads((run / "models" / "distill" / "distill_run.json").read_text())
    assert log["settings"]["teachers"]["default"].endswith("models/sft")
