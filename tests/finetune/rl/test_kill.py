"""kill -9 at any moment, then rerun: an asynchronous run in a child process is killed (SIGKILL) once it has taken
two optimizer steps; the rerun continues from its last optimizer step, keeps the rollouts it had finished (they
are not regenerated) and still enforces the staleness bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from finetune.rl.config import RLConfig
from finetune.rl.run import run_rl
from finetune.rl.scripted import ScriptedFamily, digit_tasks
from tests.finetune.rl.conftest import peaky_model

ROOT = Path(__file__).resolve().parents[3]
CFG = {"steps": 5, "max_staleness": 1, "groups_per_step": 2, "group_size": 4, "max_new_tokens": 5, "lr": 5e-3,
       "concurrency": 8}  # fmt: skip
CHILD = f"""
import sys, torch
from pathlib import Path
torch.set_num_threads(1)
from finetune.rl.config import RLConfig
from finetune.rl.run import run_rl
from finetune.rl.scripted import ScriptedFamily, digit_tasks
from model.tokenizer import Tokenizer
from tests.finetune.rl.conftest import peaky_model
run_rl(peaky_model(), Tokenizer.shipped(), ScriptedFamily(), digit_tasks(4), RLConfig(**{CFG!r}), Path(sys.argv[1]),
       max_model_len=256)
"""


class Counting(ScriptedFamily):
    def __init__(self):
        super().__init__()
        self.resets: list[str] = []

    def reset(self, task, workdir, sample=0):
        self.resets.append(workdir.name)
        return super().reset(task, workdir, sample)


def test_kill_9_then_rerun_resumes_with_the_buffer(tok, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT, env=env)
    state_path = tmp_path / "state.pt"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and child.poll() is None:
            if state_path.is_file() and torch.load(state_path, weights_only=False)["trainer"]["version"] >= 2:
                break
            time.sleep(0.05)
        assert child.poll() is None, "the child finished before it could be killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    state = torch.load(state_path, weights_only=False)
    done = state["trainer"]["version"]
    buffered = {p.stem for p in (tmp_path / "rollouts").glob("*.json")}
    fam = Counting()
    hist = run_rl(peaky_model(), tok, fam, digit_tasks(4), RLConfig(**CFG), tmp_path, max_model_len=256)
    assert [h["step"] for h in hist] == [1, 2, 3, 4, 5] and hist[:done] == state["history"]
    assert hist[done]["resumed_rollouts"] == len(buffered - {f"g{g}-s{i}" for g in state["consumed"] for i in range(4)})
    assert not buffered & set(fam.resets)  # what was finished was not run again
    assert all(int(lag) <= 1 for h in hist for lag in h["staleness_hist"])
    assert len(torch.load(state_path, weights_only=False)["consumed"]) == 10
