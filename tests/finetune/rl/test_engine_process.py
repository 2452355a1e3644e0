"""The rollout engine in its own process (finetune/rl/engine_process.py, `--rollout-engine process`): a real
`glm5 serve` child started by the run, its weight version moving with every push; a synchronous run on it samples
what the in-thread engine samples for the same seeds; the child is gone after the run, and after a kill -9 of
the run, whose rerun resumes on a fresh child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from finetune.grpo import RL_TARGETS
from finetune.rl.config import RLConfig
from finetune.rl.engine_process import ServeChild
from finetune.rl.run import run_rl
from finetune.rl.scripted import ScriptedFamily, digit_tasks
from finetune.sft import LoraSettings, add_lora
from model import GLM5ForCausalLM
from tests.glm5cli.test_finetune_sft import ckpt  # noqa: F401 (the peaky tiny checkpoint, a fixture)
from tests.serve.conftest import tiny_checkpoint  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow  # each test starts a glm5 serve (a few seconds) and runs a few RL steps


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def child_pids(log: Path) -> list[int]:
    return [
        int(line.rsplit(" ", 1)[1]) for line in log.read_text().splitlines() if "started the rollout engine" in line
    ]


def policy(ckpt):  # noqa: F811
    return add_lora(GLM5ForCausalLM.from_pretrained(ckpt), LoraSettings(rank=8, alpha=16, targets=RL_TARGETS), seed=0)


def test_a_run_on_the_process_engine_trains_and_the_childs_version_moves_per_step(ckpt, tok, tmp_path):  # noqa: F811
    cfg = RLConfig(steps=3, groups_per_step=1, group_size=4, max_new_tokens=5, lr=5e-3, max_staleness=1, concurrency=4)
    with ServeChild(ckpt, tmp_path / "engine.log", 256, cfg.concurrency, threads=1) as child:
        assert child.url.startswith("http://127.0.0.1:") and alive(child.pid)
        assert child.server._http.headers["authorization"].startswith("Bearer ")
        key = child.server._http.headers["authorization"].removeprefix("Bearer ")
        assert key not in " ".join(open(f"/proc/{child.pid}/cmdline").read().split("\0"))  # not in argv
        assert httpx.get(child.url + "/get_weight_version", timeout=30).status_code == 401  # the key is required

        def served() -> int:
            return int(child.server._http.get("/get_weight_version").json()["weight_version"])

        seen: list[int] = []
        model = policy(ckpt)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        hist = run_rl(model, tok, ScriptedFamily(), digit_tasks(2), cfg, tmp_path / "run", server=child.server,
                      max_model_len=256, log=lambda row: seen.append(served()))  # fmt: skip
        pid = child.pid
    assert seen == [2, 3, 4]  # the push at the start, then one per step
    assert [h["version"] for h in hist] == [1, 2, 3]
    assert hist[0]["mismatch"] < 1e-3  # step 1 sampled with the trainer's weights
    assert any(not (p == before[n]).all() for n, p in model.named_parameters() if n in before)  # it trained
    assert not alive(pid)  # closed with the run


def test_sync_on_the_process_engine_samples_what_the_in_thread_engine_samples(ckpt, tok, tmp_path):  # noqa: F811
    cfg = RLConfig(steps=2, groups_per_step=2, group_size=4, max_new_tokens=5, lr=5e-3, sync=True, concurrency=8)
    thread = run_rl(policy(ckpt), tok, ScriptedFamily(), digit_tasks(4), cfg, tmp_path / "thread", max_model_len=256)
    with ServeChild(ckpt, tmp_path / "engine.log", 256, cfg.concurrency, threads=1) as child:
        proc = run_rl(policy(ckpt), tok, ScriptedFamily(), digit_tasks(4), cfg, tmp_path / "proc",
                      server=child.server, max_model_len=256)  # fmt: skip
    for a, b in zip(thread, proc, strict=True):
        # the same sampled tokens: the same rewards, calls and tokens trained on
        for key in ("reward_mean", "solved_rate", "sessions", "model_calls", "staleness_hist", "groups_dropped"):
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
        # the child merges the adapter into its weights (W + s*B@A), the trainer runs it beside them: logprobs
        # agree to rounding, relative to their scale
        assert abs(a["mismatch"] - b["mismatch"]) < 1e-3


CHILD_RUN = [sys.executable, "-m", "glm5cli", "finetune", "rl"]


def test_the_child_dies_with_a_killed_run_and_the_rerun_resumes_on_a_fresh_child(ckpt, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    # synchronous: each step waits for its sessions, so the run is still early on when the kill lands
    args = [*CHILD_RUN, str(ckpt), "--out", str(out), "--env", "scripted", "--steps", "6", "--group-size", "4",
            "--groups-per-step", "1", "--max-new-tokens", "5", "--max-turns", "2", "--max-model-len", "256",
            "--lr", "5e-3", "--rank", "4", "--sync", "--concurrency", "4", "--save-every", "0",
            "--rollout-engine", "process", "--engine-threads", "1", "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    run = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = tmp_path / ".out.partial" / "rl_log.jsonl"  # the run folder until it finishes (finetune/run_dir.py)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and run.poll() is None:
        if log.is_file() and log.read_text().count("\n") >= 1:
            break
        time.sleep(0.1)
    engine_log = log.parent / "engine.log"
    (pid,) = child_pids(engine_log)
    assert run.poll() is None and alive(pid), run.stdout.read().decode()[-3000:]
    run.send_signal(signal.SIGKILL)
    run.wait()
    gone = time.monotonic() + 20
    while alive(pid) and time.monotonic() < gone:
        time.sleep(0.1)
    assert not alive(pid)  # PR_SET_PDEATHSIG: the child did not outlive its run
    done = log.read_text().count("\n")
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"from step {done} of 6" in r.stderr
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["steps"] == 6
    rows = [json.loads(line) for line in (out / "rl_log.jsonl").read_text().splitlines()]
    assert [row["version"] for row in rows] == [1, 2, 3, 4, 5, 6]
    # the fresh child served the restored version: synchronous, so every sample is from the trainer's version
    # (a child reporting another version would have its samples dropped as stale)
    assert all(set(row["staleness_hist"]) == {"0"} for row in rows)
    assert sum(row["groups_dropped"] for row in rows) == 0
    pids = child_pids(out / "engine.log")
    assert len(pids) == 2 and all(not alive(p) for p in pids)  # the killed run's child and the rerun's


def test_quant_int4_trains_the_policy_the_int4_child_samples(tok, tmp_path):  # noqa: F811
    """`glm5 finetune rl --quant int4`: the child serves --quant int4 with the pushed adapter beside the int4
    weights, the trainer rounds its frozen weights as that INT4 does (round_like_int4): the logprobs the child
    samples with are the trainer's to the kernels' rounding, far closer than the unrounded trainer's."""
    import copy
    import dataclasses

    import torch

    from finetune.lora import save_adapter
    from finetune.rl.objective import token_logprobs
    from finetune.rl.rollout import TokenSample
    from finetune.rl.server import GenParams
    from model.config import preset
    from model.quant_int4 import round_like_int4
    from model.tokenizer import save_tokenizer_files

    wide = tmp_path / "wide"  # hidden 128: most linears are INT4 (tiny's 64 columns make no group of 128)
    GLM5ForCausalLM.from_config(dataclasses.replace(preset("tiny"), hidden_size=128), seed=0).save_pretrained(wide)
    save_tokenizer_files(wide)
    plain = GLM5ForCausalLM.from_pretrained(wide)
    rounded = copy.deepcopy(plain)
    assert len(round_like_int4(rounded)) > 10
    nets = {}
    for name, m in (("rounded", rounded), ("plain", plain)):
        nets[name] = add_lora(m, LoraSettings(rank=4, alpha=8, targets=RL_TARGETS), seed=0)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for n, p in nets[name].named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    save_adapter(nets["rounded"], tmp_path / "adapter")
    prompt = tok.encode("Fix the bug in the parser.")
    with ServeChild(wide, tmp_path / "engine.log", 256, 4, threads=1, quant="int4") as child:
        assert "INT4 weights" in (tmp_path / "engine.log").read_text()
        child.server.load_lora_adapter("rl", str(tmp_path / "adapter"), 1)
        out = [child.server.generate(prompt, GenParams(16, 1.0, seed=s)) for s in range(3)]
    err = {}
    for name, net in nets.items():
        samples = [TokenSample(prompt + g.ids, [0] * len(prompt) + [1] * len(g.ids), [0.0] * len(prompt) + g.logprobs,
                               1) for g in out]  # fmt: skip
        with torch.no_grad():
            lps = token_logprobs(net, samples, 1.0)
        err[name] = max((lp - torch.tensor(g.logprobs)).abs().max().item() for lp, g in zip(lps, out, strict=True))
    assert err["rounded"] < 0.25 * err["plain"] and err["rounded"] < 2e-2, err
