"""glm5's torch threads: every core, a passive wait on a busy machine, the user's settings kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from glm5cli import threads


@pytest.mark.parametrize(
    "cpus, load, processes, expected",
    [
        (2, 0.0, 1, (2, False)),  # an idle machine: every core, OpenMP's default spin
        (2, 0.9, 1, (2, False)),
        (2, 1.0, 1, (2, True)),  # a core's worth of other jobs: threads that wait sleep
        (2, 5.5, 1, (2, True)),  # the shared CI runner of the report
        (16, 4.2, 1, (16, False)),
        (16, 0.0, 4, (4, False)),  # torchrun's four ranks share the cores
        (16, 30.0, 32, (1, True)),
    ],
)
def test_plan(cpus, load, processes, expected):
    assert threads.plan(cpus, load, processes) == expected


def test_choose_sets_threads_and_on_a_busy_machine_a_passive_wait():
    env: dict[str, str] = {}
    assert threads.choose(env, cpus=2, load=6.0) == (2, True)
    assert env == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE", threads.MARK: "2,passive"}
    env = {}
    assert threads.choose(env, cpus=2, load=0.2) == (2, False)
    assert env == {"OMP_NUM_THREADS": "2", threads.MARK: "2,"}


def test_the_users_settings_stand():
    env = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.choose(env, cpus=2, load=6.0) is None
    assert env == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}
    env = {"GOMP_SPINCOUNT": "5"}
    assert threads.choose(env, cpus=2, load=6.0) == (2, False) and "OMP_WAIT_POLICY" not in env
    env = {"OMP_NUM_THREADS": "1"}  # the user's count; the wait is still glm5's to choose
    assert threads.choose(env, cpus=2, load=6.0) == (1, True)
    assert env[threads.MARK] == ",passive"  # the count is not marked: a child keeps the user's 1
    assert threads.choose(env, cpus=2, load=0.0) == (1, False) and env["OMP_NUM_THREADS"] == "1"


def test_a_child_glm5_chooses_again_unless_its_parent_set_another_value():
    env = {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE", threads.MARK: "2,passive"}  # inherited
    assert threads.choose(env, cpus=2, load=0.0) == (2, False) and "OMP_WAIT_POLICY" not in env  # now idle
    env = {"OMP_NUM_THREADS": "1", threads.MARK: "2,"}  # a parent set 1 for this child on purpose
    assert threads.choose(env, cpus=2, load=0.0) == (1, False) and env["OMP_NUM_THREADS"] == "1"


def test_torchrun_ranks_share_the_cores():
    assert threads.choose({"LOCAL_WORLD_SIZE": "2"}, cpus=8, load=0.0) == (4, False)


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
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", threads.MARK)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    omp, mark, torch_threads = r.stdout.split()[-3:]
    assert mark.startswith(f"{omp},") and int(torch_threads) == int(omp) == len(os.sched_getaffinity(0))


def test_proof_stages_choose_their_own_threads_unless_the_run_pins_them(tmp_path, monkeypatch):
    from finetune.proof.measure import child_env

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv(threads.MARK, "2,")  # the proof's own process chose 2 when it started
    env = child_env(tmp_path)
    assert env[threads.MARK] == "2," and env["OMP_NUM_THREADS"] == "2"  # a stage chooses again when it starts
    (tmp_path / "proof.json").write_text('{"threads": 2}')
    env = child_env(tmp_path)
    assert env["OMP_NUM_THREADS"] == "2" and threads.MARK not in env  # pinned: the stage keeps it
