"""glm5's torch threads: the free cores at start, the user's OMP_NUM_THREADS kept, OpenMP's short spin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from glm5cli import threads


@pytest.mark.parametrize(
    "cpus, load, processes, expected",
    [
        (2, 0.0, 1, 2),  # an idle machine: every core
        (2, 0.4, 1, 2),
        (2, 1.0, 1, 1),
        (2, 5.5, 1, 1),  # the shared CI runner of the report: one thread, not two spinning on busy cores
        (16, 4.2, 1, 12),
        (16, 0.0, 4, 4),  # torchrun's four ranks share the cores
        (16, 30.0, 4, 1),
        (4, -1.0, 1, 4),  # never more than the cores
    ],
)
def test_free_cores(cpus, load, processes, expected):
    assert threads.free_cores(cpus, load, processes) == expected


def test_choose_sets_threads_and_a_short_spin_when_the_user_did_not():
    env: dict[str, str] = {}
    assert threads.choose(env, cpus=2, load=6.0) == 1
    assert env == {"OMP_NUM_THREADS": "1", threads.MARK: "1", "GOMP_SPINCOUNT": threads.SPINS}


def test_the_users_omp_num_threads_and_wait_policy_stand():
    env = {"OMP_NUM_THREADS": "2"}
    assert threads.choose(env, cpus=2, load=6.0) is None
    assert env == {"OMP_NUM_THREADS": "2"}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    threads.choose(env, cpus=2, load=0.0)
    assert env["OMP_NUM_THREADS"] == "2" and "GOMP_SPINCOUNT" not in env
    env = {"GOMP_SPINCOUNT": "5"}
    threads.choose(env, cpus=2, load=0.0)
    assert env["GOMP_SPINCOUNT"] == "5"


def test_a_child_glm5_chooses_again_unless_its_parent_pinned_a_number():
    env = {"OMP_NUM_THREADS": "2", threads.MARK: "2"}  # a parent glm5's own choice, inherited
    assert threads.choose(env, cpus=2, load=6.0) == 1
    env = {"OMP_NUM_THREADS": "2", threads.MARK: "1"}  # the parent (or the user) set another number on purpose
    assert threads.choose(env, cpus=2, load=6.0) is None and env["OMP_NUM_THREADS"] == "2"


def test_torchrun_ranks_share_the_free_cores():
    env = {"LOCAL_WORLD_SIZE": "2"}
    assert threads.choose(env, cpus=8, load=0.0) == 4


def test_main_chooses_before_torch_loads_and_torch_follows():
    # the glm5 entry point sets the variables; torch, imported afterwards by a command, starts that many threads
    code = (
        "import os, sys\n"
        "sys.argv = ['glm5', '--help']\n"
        "from glm5cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "print(os.environ['OMP_NUM_THREADS'], os.environ['GLM5_AUTO_THREADS'], torch.get_num_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", threads.MARK)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    omp, mark, torch_threads = r.stdout.split()[-3:]
    assert omp == mark and int(torch_threads) == int(omp) and 1 <= int(omp) <= (os.cpu_count() or 1)


def test_proof_stages_choose_their_own_threads_unless_the_run_pins_them(tmp_path, monkeypatch):
    from finetune.proof.measure import child_env

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv(threads.MARK, "2")  # the proof's own process chose 2 when it started
    env = child_env(tmp_path)
    assert env[threads.MARK] == env["OMP_NUM_THREADS"]  # a stage may choose again when it starts
    (tmp_path / "proof.json").write_text('{"threads": 2}')
    env = child_env(tmp_path)
    assert env["OMP_NUM_THREADS"] == "2" and threads.MARK not in env  # pinned: the stage keeps it
