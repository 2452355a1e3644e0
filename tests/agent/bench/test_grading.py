"""Grading in a real checkout: the gold patch resolves, and the hard cases come out as the harness says."""

from __future__ import annotations

import sysconfig

import pytest

from agent.bench.environments import EnvSpec
from agent.bench.grades import INFRA_ERROR, RESOLVED, UNRESOLVED
from agent.bench.grading import default_test_cmd, grade_swe
from agent.bench.local_env import LocalEnvironment
from agent.bench.repos import RepoCache
from agent.bench.tasks import swe_task_from_row
from agent.sandbox import probe
from tests.agent.bench.conftest import CALC_FIX, calc_row, diff_between

pytestmark = pytest.mark.skipif(probe(False) is not None, reason="bubblewrap cannot run here")


def grade(tmp_path, repo, patch, name="g", flaky_reruns=0, **row_over):
    task = swe_task_from_row(calc_row(repo, **row_over), "t:1")
    cache = RepoCache(tmp_path / "cache")
    env = LocalEnvironment(
        EnvSpec(tmp_path / name, app_source=lambda d: cache.checkout(task.repo, task.base_commit, d))
    )
    env.start()
    return task, grade_swe(task, patch, env, timeout_s=60, flaky_reruns=flaky_reruns)


def test_default_test_command_runs_the_files_the_tests_name():
    row = {
        "instance_id": "x",
        "repo": "r",
        "base_commit": "b",
        "problem_statement": "p",
        "test_patch": "diff --git a/tests/test_new.py b/tests/test_new.py\n",
        "FAIL_TO_PASS": ["tests/test_a.py::test_x[1]"],
    }
    assert default_test_cmd(swe_task_from_row(row, "t:1")) == (
        "python -m pytest -rA -p no:cacheprovider tests/test_new.py tests/test_a.py"
    )


def test_gold_patch_resolves_and_nop_does_not(tmp_path, calc_repo):
    task, g = grade(tmp_path, calc_repo, None or calc_row(calc_repo)["patch"])
    assert g.status == RESOLVED and g.resolved is True and g.reward == 1.0, g.log
    assert g.tests == {"test_add.py::test_add": "PASSED", "test_mul.py::test_mul": "PASSED"}
    assert g.apply_method == "git apply"
    _, n = grade(tmp_path, calc_repo, "", name="nop")
    assert n.status == UNRESOLVED and n.resolved is False
    assert n.fail_to_pass["failure"] == ["test_add.py::test_add"] and n.pass_to_pass["failure"] == []


def test_patch_that_does_not_apply(tmp_path, calc_repo):
    bad = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n-def nothing():\n-    pass\n+x\n+y\n"
    _, g = grade(tmp_path, calc_repo, bad)
    assert g.status == UNRESOLVED and g.patch_applied is False and "does not apply" in g.reason
    assert "patch --batch" in g.log  # all three methods were tried


def test_fuzzy_patch_applies_with_the_fallback(tmp_path, calc_repo):
    # a context line that differs from the file: git apply refuses, patch --fuzz takes it
    gold = calc_row(calc_repo)["patch"].replace(" def mul(a, b):", " def mul(a,  b):")
    _, g = grade(tmp_path, calc_repo, gold)
    assert g.resolved is True and g.apply_method in ("git apply --3way", "patch --fuzz"), g.log


def test_collection_error_is_unresolved(tmp_path, calc_repo):
    broken = diff_between(calc_repo, {"calc.py": CALC_FIX + "\nthis is not python\n"})
    _, g = grade(tmp_path, calc_repo, broken)
    assert g.status == UNRESOLVED and g.resolved is False
    assert set(g.tests.values()) == {"MISSING"}  # the tests never got to run, so none passed


def test_tests_that_did_not_run_are_an_infra_error(tmp_path, calc_repo):
    # the suite does not run with the prediction nor without it: the task is broken, not the prediction
    _, g = grade(tmp_path, calc_repo, calc_row(calc_repo)["patch"], test_cmd="no-such-runner --all")
    assert g.status == INFRA_ERROR and g.resolved is None and "did not run" in g.reason


def test_a_prediction_that_stops_the_suite_is_unresolved_not_an_infra_error(tmp_path, calc_repo):
    # a conftest.py that exits 0 before any test: an infra error would leave the task out of the resolved rate,
    # so an agent could raise its score by breaking the suite where it cannot solve the task
    patch = diff_between(calc_repo, {"conftest.py": "import os\nos._exit(0)\n"})
    _, g = grade(tmp_path, calc_repo, patch)
    assert g.status == UNRESOLVED and g.resolved is False and "run without it" in g.reason, g.reason


def test_pass_to_pass_broken_by_the_patch(tmp_path, calc_repo):
    both = diff_between(calc_repo, {"calc.py": CALC_FIX.replace("return a * b", "return a ** b")})
    _, g = grade(tmp_path, calc_repo, both)
    assert g.status == UNRESOLVED and g.pass_to_pass["failure"] == ["test_mul.py::test_mul"]
    assert g.fail_to_pass["failure"] == []


def test_prediction_editing_the_tests_does_not_count(tmp_path, calc_repo):
    cheat = diff_between(calc_repo, {"test_add.py": "def test_add():\n    assert True\n"})
    _, g = grade(tmp_path, calc_repo, cheat)
    assert g.resolved is False  # test_add.py was replaced by the task's own before the run


def test_flaky_test_is_rerun_and_named(tmp_path, calc_repo):
    # test_mul fails on the first run and passes on the second (a marker file under /app persists between runs)
    flaky = (
        "import os\nfrom calc import mul\n\n\ndef test_mul():\n"
        "    first = not os.path.exists('.ran')\n    open('.ran', 'w').close()\n"
        "    assert not first and mul(2, 3) == 6\n"
    )
    patch = diff_between(calc_repo, {"calc.py": CALC_FIX, "test_mul.py": flaky})
    _, g = grade(tmp_path, calc_repo, patch, flaky_reruns=1)
    assert g.resolved is True and g.flaky_tests == ["test_mul.py::test_mul"], g.log
    _, first = grade(tmp_path, calc_repo, patch, name="first")  # the default: the first run is the grade
    assert first.resolved is False and first.flaky_tests == []


# -- the host never writes through a path a trial could change (issue 40, item 1) -------------------------------


def _link_planting_conftest(names: list[str], scratch, victim, then: str) -> str:
    """A conftest.py that replaces each of `names` in every writable folder it can reach (the trial's scratch
    folder, /logs/verifier) by a link to `victim`, then `then`."""
    return (
        "import os\n"
        f"for d in ({str(scratch)!r}, '/logs/verifier', '/logs'):\n"
        f"    for n in {names!r}:\n"
        "        p = os.path.join(d, n)\n"
        "        try:\n"
        "            if os.path.lexists(p):\n"
        "                os.unlink(p)\n"
        f"            os.symlink({str(victim)!r}, p)\n"
        "        except OSError:\n"
        "            pass\n"
        f"{then}\n"
    )


def test_a_prediction_cannot_make_the_grader_write_a_host_file(tmp_path, calc_repo):
    # the prediction's conftest.py, run inside the sandbox, replaces the grader's files in the trial's scratch
    # folder with links to a host file and stops the suite; the grader then reruns without the prediction and
    # (before the fix) wrote test_patch through the link onto the host file
    victim = tmp_path / "victim.pth"
    victim.write_text("untouched\n")
    scratch = tmp_path / "g" / "tmp"  # the grading environment's scratch folder, writable inside
    conftest = _link_planting_conftest(["test.patch", "prediction.diff"], scratch, victim, "os._exit(0)")
    patch = diff_between(calc_repo, {"conftest.py": conftest})
    _, g = grade(tmp_path, calc_repo, patch)
    assert victim.read_text() == "untouched\n" and not victim.is_symlink()
    assert g.status == UNRESOLVED and "run without it" in g.reason, g.reason


def test_a_task_setup_cannot_make_the_grader_write_a_host_file(tmp_path, calc_repo):
    # the setup runs in the grading environment before the prediction is applied: links it plants where the
    # grader puts its files are not followed by the host
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    plant = " ".join(
        f"rm -f {d}/{n}; ln -s {victim} {d}/{n};"
        for d in (tmp_path / "s" / "tmp", "/logs/verifier") for n in ("prediction.diff", "test.patch")
    )  # fmt: skip
    # a setup makes the task's own venv (agent/bench/setup_cache.py): this one lends it the test runner's pytest
    runner = sysconfig.get_paths()["purelib"]
    lend = f"echo {runner} > \"$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/runner.pth\";"
    task = swe_task_from_row(calc_row(calc_repo, setup=f"{lend} mkdir -p /logs/verifier; {plant} true"), "t:1")
    cache = RepoCache(tmp_path / "cache")
    env = LocalEnvironment(EnvSpec(tmp_path / "s", app_source=lambda d: cache.checkout(task.repo, task.base_commit, d),
                                   setup=task.setup, setup_key="calc@1", cache_dir=tmp_path / "cache"))  # fmt: skip
    env.start()
    g = grade_swe(task, calc_row(calc_repo)["patch"], env, timeout_s=60)
    assert victim.read_text() == "untouched\n"
    assert g.status == RESOLVED, g.log
