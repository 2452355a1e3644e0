"""Rows as the official harness publishes them: glm5's grade equals `swebench.harness`'s report on the same log.

For each parser the installed harness has, a log in that runner's real output format (the lines its parser reads,
with the noise around them); glm5 grades it as a trial would (task_statuses + judge_task) and the harness grades
the same log framed as its eval script frames it (get_eval_report). The two must agree on resolved and on every
FAIL_TO_PASS / PASS_TO_PASS test. Where a parser needs knowledge of a specific instance (jekyll, the JavaScript
repositories keyed by PR number), its row names such an instance.
"""

from __future__ import annotations

import pytest

swebench = pytest.importorskip("swebench", reason="the swebench extra is not installed (pip install 'glm5[swebench]')")

from agent.bench import harness_specs  # noqa: E402
from agent.bench.grading import judge_task, task_statuses, task_test_cmd  # noqa: E402
from agent.bench.tasks import TaskError, swe_task_from_row  # noqa: E402
from tests.agent.bench import harness_samples  # noqa: E402

PYTEST = """============================= test session starts ==============================
platform linux -- Python 3.9.19, pytest-7.4.0, pluggy-1.3.0
collected 4 items

testing/test_a.py ..Fs                                                   [100%]

=================================== FAILURES ===================================
___________________________________ test_c ____________________________________
    def test_c():
>       assert 1 == 2
E       assert 1 == 2
=========================== short test summary info ============================
PASSED testing/test_a.py::test_a
PASSED testing/test_a.py::test_b[/tmp/pytest-of-root/pytest-0/x.txt]
SKIPPED [1] testing/test_a.py:12: needs numpy
FAILED testing/test_a.py::test_c - assert 1 == 2
==================== 1 failed, 2 passed, 1 skipped in 0.12s ====================
"""
PYTEST_CASES = (["testing/test_a.py::test_a"], ["testing/test_a.py::test_c"])

DJANGO = """Testing against Django installed in '/testbed/django'
Importing application queries
test_basic (queries.tests.Queries1Tests) ... ok
test_ticket7098 (queries.tests.Queries1Tests) ... FAIL
test_skip (queries.tests.Queries1Tests) ... skipped 'Database has feature(s) supports_x'
test_noisy (queries.tests.Queries1Tests) ... Internal Server Error: /x/
ok

======================================================================
FAIL: test_ticket7098 (queries.tests.Queries1Tests)
----------------------------------------------------------------------
Ran 4 tests in 0.031s

FAILED (failures=1, skipped=1)
"""

SYMPY = """============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
random seed:        58263544

sympy/core/tests/test_basic.py[3]
test_structure ok
test_equality ok
test_subs F

________________________________________________________________________________
_____________ sympy/core/tests/test_basic.py:test_subs _____________
  File "/testbed/sympy/core/tests/test_basic.py", line 40, in test_subs
    assert b21.subs([(b2, b1), (b1, b2)]) == Basic(b2, b2)
AssertionError

============= tests finished: 2 passed, 1 failed, in 0.08 seconds ==============
DO *NOT* COMMIT!
"""

SEABORN = """tests/test_core.py::TestSemanticMapping::test_call_lookup PASSED [ 50%]
tests/test_core.py::TestSemanticMapping::test_bad PASSED [ 75%]
FAILED tests/test_core.py::TestHueMapping::test_init_from_map - KeyError
========================= 1 failed, 2 passed in 1.02s ==========================
"""

PYTEST_V2 = """\x1b[32mPASSED\x1b[0m astropy/io/tests/test_x.py::test_read
\x1b[32mPASSED\x1b[0m astropy/io/tests/test_x.py::test_roundtrip[a b]
\x1b[31mFAILED\x1b[0m astropy/io/tests/test_x.py::test_write - AssertionError: x
astropy/io/tests/test_x.py::test_old PASSED
========================= 1 failed, 3 passed in 0.50s ==========================
"""

GO = """=== RUN   TestParse
--- PASS: TestParse (0.00s)
=== RUN   TestRender
=== RUN   TestRender/empty
--- FAIL: TestRender (0.01s)
    --- FAIL: TestRender/empty (0.00s)
--- SKIP: TestNetwork (0.00s)
FAIL
FAIL\tgithub.com/gin-gonic/gin\t0.021s
"""

CARGO = """running 3 tests
test parse::tests::simple ... ok
test parse::tests::unicode ... FAILED
test search::tests::slow ... ignored

failures:
test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s
"""

JEST = """PASS src/__tests__/a.test.js
  parser
    ✓ reads a file (3 ms)
    ✕ reads an empty file (1 ms)
    ○ skipped reads a huge file
Tests:       1 failed, 1 skipped, 1 passed, 3 total
"""

VITEST = """ ✓ src/a.test.ts (2)
   ✓ adds numbers 2ms
   × subtracts numbers 3ms
   ↓ divides [skipped]
 Test Files  1 failed (1)
      Tests  1 failed | 1 passed | 1 skipped (3)
"""

TAP = """TAP version 13
ok 1 reads a file
not ok 2 reads an empty file
  ---
  ...
1..2
# tests 2
# pass  1
# fail  1
"""

MAVEN = """+ mvn test -B -Dtest=com.google.gson.GsonTest#testOne
[INFO] Tests run: 1, Failures: 0, Errors: 0, Skipped: 0
[INFO] BUILD SUCCESS
+ mvn test -B -Dtest=com.google.gson.GsonTest#testTwo
[ERROR] Tests run: 1, Failures: 1, Errors: 0, Skipped: 0
[INFO] BUILD FAILURE
"""

ANT = """    [junit] [PASS] lombok.TestJavac.testA
    [junit] [FAIL] lombok.TestJavac.testB
    [junit] Tests run: 2, Failures: 1
"""

GRADLE = """> Task :test
org.apache.lucene.TestA > testOne PASSED
org.apache.lucene.TestA > testTwo FAILED
BUILD FAILED in 3s
"""

PHPUNIT = """PHPUnit 10.5.0 by Sebastian Bergmann and contributors.

Carbon Interval (Tests\\CarbonInterval\\Construct)
 ✔ Defaults
 ✘ Nulls
 ↩ Skipped one

Tests: 3, Assertions: 2, Failures: 1, Skipped: 1.
"""

REDIS = """[ok]: SET and GET an item (1 ms)
[err]: DEL against a single item in tests/unit/keyspace.tcl
[skip]: Needs debug
\\o/ All tests passed
"""

JQ = """  PASS: tests/jqtest
  FAIL: tests/mantest
# TOTAL: 2
"""

GOOGLETEST = """[==========] Running 2 tests from 1 test suite.
[       OK ] Suite.One (0 ms)
[  FAILED  ] Suite.Two (1 ms)
[==========] 2 tests from 1 test suite ran. (1 ms total)
"""

MICROPYTHON = """pass  basics/int.py
FAIL  basics/float.py
skip  basics/io.py
2 tests performed
"""

RUBY_UNIT = """Loaded suite -e
Started
TestEveryWord: \n  test_capitalizes_every_word:\t\t\t\tF
===============================================================================
Failure: test_capitalizes_every_word(TestEveryWord)
/app/test/test_every_word.rb:6:in `test_capitalizes_every_word'
===============================================================================
: (0.003470)
TestOneWord: \n  test_capitalizes_one_word:\t\t\t\t.: (0.000288)
Finished in 0.006737236 seconds.
2 tests, 2 assertions, 1 failures, 0 errors, 0 pendings, 0 omissions, 0 notifications
"""

# parser -> (log, repo, FAIL_TO_PASS, PASS_TO_PASS, exit code): each names a passing and a failing test of its log
CASES = {
    "parse_log_pytest": (PYTEST, "pytest-dev/pytest", *PYTEST_CASES, 1),
    "parse_log_pytest_options": (PYTEST, "pydicom/pydicom", ["testing/test_a.py::test_b[/x.txt]"],
                                 ["testing/test_a.py::test_c"], 1),
    "parse_log_sqlfluff": (PYTEST, "sqlfluff/sqlfluff", *PYTEST_CASES, 1),
    "parse_log_astroid": (PYTEST, "pylint-dev/astroid", *PYTEST_CASES, 1),
    "parse_log_flask": (PYTEST, "pallets/flask", *PYTEST_CASES, 1),
    "parse_log_marshmallow": (PYTEST, "marshmallow-code/marshmallow", *PYTEST_CASES, 1),
    "parse_log_pvlib": (PYTEST, "pvlib/pvlib-python", *PYTEST_CASES, 1),
    "parse_log_pyvista": (PYTEST, "pyvista/pyvista", *PYTEST_CASES, 1),
    "parse_log_xarray": (PYTEST, "pydata/xarray", *PYTEST_CASES, 1),
    "parse_log_pydicom": (PYTEST, "pydicom/pydicom", *PYTEST_CASES, 1),
    "parse_log_requests": (PYTEST, "psf/requests", *PYTEST_CASES, 1),
    "parse_log_pylint": (PYTEST, "pylint-dev/pylint", *PYTEST_CASES, 1),
    "parse_log_matplotlib": (PYTEST, "matplotlib/matplotlib", *PYTEST_CASES, 1),
    "parse_log_django": (DJANGO, "django/django", ["test_basic (queries.tests.Queries1Tests)"],
                         ["test_ticket7098 (queries.tests.Queries1Tests)"], 1),
    "parse_log_sympy": (SYMPY, "sympy/sympy", ["test_structure"], ["test_subs"], 1),
    "parse_log_seaborn": (SEABORN, "mwaskom/seaborn", ["tests/test_core.py::TestSemanticMapping::test_call_lookup"],
                          ["tests/test_core.py::TestHueMapping::test_init_from_map"], 1),
    "parse_log_pytest_v2": (PYTEST_V2, "astropy/astropy", ["astropy/io/tests/test_x.py::test_read"],
                            ["astropy/io/tests/test_x.py::test_write"], 1),
    "parse_log_astropy": (PYTEST_V2, "astropy/astropy", ["astropy/io/tests/test_x.py::test_roundtrip[a b]"],
                          ["astropy/io/tests/test_x.py::test_write"], 1),
    "parse_log_scikit": (PYTEST_V2, "scikit-learn/scikit-learn", ["astropy/io/tests/test_x.py::test_old"],
                         ["astropy/io/tests/test_x.py::test_write"], 1),
    "parse_log_sphinx": (PYTEST_V2, "sphinx-doc/sphinx", ["astropy/io/tests/test_x.py::test_read"],
                         ["astropy/io/tests/test_x.py::test_write"], 1),
    "parse_log_gotest": (GO, "gin-gonic/gin", ["TestParse"], ["TestRender/empty"], 1),
    "parse_log_cargo": (CARGO, "burntsushi/ripgrep", ["parse::tests::simple"], ["parse::tests::unicode"], 101),
    "parse_log_jest": (JEST, "iamkun/dayjs", ["reads a file"], ["reads an empty file"], 1),
    "parse_log_vitest": (VITEST, "vuejs/core", ["adds numbers"], ["subtracts numbers"], 1),
    "parse_log_tap": (TAP, "tapjs/tap", ["reads a file"], ["reads an empty file"], 1),
    "parse_log_maven": (MAVEN, "google/gson", ["com.google.gson.GsonTest#testOne"],
                        ["com.google.gson.GsonTest#testTwo"], 1),
    "parse_log_ant": (ANT, "projectlombok/lombok", ["lombok.TestJavac.testA"], ["lombok.TestJavac.testB"], 1),
    "parse_log_gradle_custom": (GRADLE, "apache/lucene", ["org.apache.lucene.TestA > testOne"],
                                ["org.apache.lucene.TestA > testTwo"], 1),
    "parse_log_phpunit": (PHPUNIT, "briannesbitt/carbon", ["Carbon Interval > Defaults"],
                          ["Carbon Interval > Nulls"], 1),
    "parse_log_ruby_unit": (RUBY_UNIT, "fluent/fluentd", ["test_capitalizes_one_word"],
                            ["test_capitalizes_every_word"], 1),
    "parse_log_redis": (REDIS, "redis/redis", ["SET and GET an item"], ["DEL against a single item"], 1),
    "parse_log_jq": (JQ, "jqlang/jq", ["tests/jqtest"], ["tests/mantest"], 1),
    "parse_log_googletest": (GOOGLETEST, "fmtlib/fmt", ["Suite.One"], ["Suite.Two"], 1),
    "parse_log_micropython_test": (MICROPYTHON, "micropython/micropython", ["basics/int.py"], ["basics/float.py"], 1),
}  # fmt: skip
CASES.update(harness_samples.MORE_CASES)  # the parsers bound to one repository's runner


def published_row(parser: str, repo: str, f2p: list[str], p2p: list[str], **over) -> dict:
    """A row with the harness's own fields and no glm5 extras (no test_cmd, no setup)."""
    row = {
        "instance_id": f"{repo.replace('/', '__')}-1",
        "repo": repo,
        "base_commit": "0" * 40,
        "problem_statement": "p",
        "version": "1.0",
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "log_parser": parser,
        "eval_type": "pass_and_fail",
        "image": f"swebench/sweb.eval.x86_64.{repo.replace('/', '_1776_')}-1:latest",
        "eval_script": "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\nrun-tests\n"
        ": '>>>>> End Test Output'\n",
    }
    row.update(over)
    return row


def glm5_and_harness(row: dict, log: str, rc: int):
    task = swe_task_from_row(row, "t:1")
    statuses, problem = task_statuses(task, log, rc, task_test_cmd(task))
    grade = judge_task(task, statuses) if not problem else None
    report = harness_specs.harness_report(task, "diff", harness_specs.frame(log, rc))[task.instance_id]
    return task, statuses, problem, grade, report


@pytest.mark.parametrize("parser", sorted(CASES))
def test_glm5_grades_each_parser_as_the_harness_does(parser):
    log, repo, f2p, p2p, rc = CASES[parser]
    # one row as logged (a passing F2P, a failing P2P) and one where every named test passes
    for fail, passing in ((p2p, f2p), ([], f2p)):
        _, statuses, problem, grade, report = glm5_and_harness(published_row(parser, repo, passing, fail), log, rc)
        assert statuses, f"{parser}: the log parsed to nothing (the sample is not in its format)"
        assert not problem and report["patch_successfully_applied"], problem
        assert grade.resolved == report["resolved"]
        ts = report["tests_status"]
        assert grade.fail_to_pass == ts["FAIL_TO_PASS"] and grade.pass_to_pass == ts["PASS_TO_PASS"]
        assert grade.resolved is (not fail)


# parsers that pick a format by the row's instance number (jekyll: instance_id.split("-")[1]; immutable_js:
# split("-")[-1]) and raise ValueError for any other: each graded with a row of that number and a log in the format
# it dispatches to
BY_INSTANCE = {
    "parse_log_jekyll": (("jekyll__jekyll-9141", "parse_log_minitest"), ("jekyll__jekyll-8761", "parse_log_cucumber")),
    "parse_log_immutable_js": (("immutable-js__immutable-js-2005", "parse_log_jest_json"),
                               ("immutable-js__immutable-js-2006", "parse_log_jest")),
}  # fmt: skip


@pytest.mark.parametrize("parser", sorted(BY_INSTANCE))
def test_parsers_chosen_by_instance_grade_as_the_harness_does(parser):
    for instance_id, fmt in BY_INSTANCE[parser]:
        log, _, f2p, p2p, rc = CASES[fmt]
        for fail, passing in ((p2p, f2p), ([], f2p)):
            repo = instance_id.rsplit("-", 1)[0].replace("__", "/")
            row = published_row(parser, repo, passing, fail, instance_id=instance_id)
            _, statuses, problem, grade, report = glm5_and_harness(row, log, rc)
            assert statuses and not problem, (instance_id, problem)
            ts = report["tests_status"]
            assert grade.resolved == report["resolved"] and grade.resolved is (not fail)
            assert grade.fail_to_pass == ts["FAIL_TO_PASS"] and grade.pass_to_pass == ts["PASS_TO_PASS"]


def test_every_harness_parser_is_checked():
    """A parser the harness adds shows up here: it needs a real-format log in CASES (or a row in BY_INSTANCE)."""
    assert set(harness_specs.parser_names()) - set(CASES) - set(BY_INSTANCE) == set()


def test_a_sympy_row_as_published_is_resolved_where_glm5_used_to_say_infra_error():
    row = published_row("parse_log_sympy", "sympy/sympy", ["test_structure", "test_equality"], [])
    _, statuses, problem, grade, report = glm5_and_harness(row, SYMPY, 1)
    assert statuses["test_subs"] == "FAILED" and not problem
    assert grade.resolved is True and report["resolved"] is True


def test_the_test_command_comes_from_the_eval_script():
    script = ("#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\nconda activate testbed\n"
              "cd /testbed\ngit checkout abc sympy/core/tests/test_basic.py\n"
              "git apply -v - <<'EOF_1'\ndiff --git a/x b/x\nEOF_1\n: '>>>>> Start Test Output'\n"
              "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose "
              "sympy/core/tests/test_basic.py\n: '>>>>> End Test Output'\n"
              "git checkout abc sympy/core/tests/test_basic.py\n")  # fmt: skip
    row = published_row("parse_log_sympy", "sympy/sympy", ["test_structure"], [], eval_script=script)
    assert task_test_cmd(swe_task_from_row(row, "t:1")) == (
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose "
        "sympy/core/tests/test_basic.py"
    )


def test_a_log_the_harness_does_not_believe_is_not_graded():
    # every test passes in the log, but the command failed: a conftest.py printing PASSED lines, say
    row = published_row("parse_log_pytest", "pytest-dev/pytest", ["t.py::a"], [])
    log = "PASSED t.py::a\n===== 1 passed in 0.1s =====\n"
    _, _, problem, _, report = glm5_and_harness(row, log, 2)
    assert problem and report["resolved"] is False
    _, _, problem, grade, _ = glm5_and_harness(row, log, 0)
    assert not problem and grade.resolved is True


def test_fail_only_rows_follow_the_harness():
    # eslint's parser lists only failures: under fail_only a test absent from the log has passed
    row = published_row("parse_log_jest", "eslint/eslint", ["reads a file", "not in the log"], [],
                        eval_type="fail_only")  # fmt: skip
    _, _, problem, grade, report = glm5_and_harness(row, JEST, 1)
    assert not problem and grade.resolved is report["resolved"] is True


def test_rows_name_a_parser_the_harness_has_and_an_eval_type_it_knows():
    with pytest.raises(TaskError, match="not one the installed swebench harness has"):
        swe_task_from_row(published_row("parse_log_nonesuch", "a/b", ["x"], []), "t:1")
    with pytest.raises(TaskError, match="eval_type"):
        swe_task_from_row(published_row("parse_log_pytest", "a/b", ["x"], [], eval_type="lenient"), "t:1")


def test_image_names_are_the_harness_s():
    assert harness_specs.image_name("sympy__sympy-20590") == "sweb.eval.x86_64.sympy__sympy-20590:latest"
    assert harness_specs.image_name("sympy__sympy-20590", "swebench") == (
        "swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest"
    )


def test_python_version_from_the_environment_dockerfile():
    assert harness_specs.python_version("RUN conda create -n testbed python=3.9 mpmath flake8 -y") == "3.9"
    assert harness_specs.python_version("FROM python:3.11-slim\n") == "3.11"
    row = published_row("parse_log_sympy", "sympy/sympy", ["x"], [],
                        dockerfile="RUN conda create -n testbed python=3.9 -y")  # fmt: skip
    assert swe_task_from_row(row, "t:1").python == "3.9"


@pytest.mark.skipif(__import__("agent.sandbox").sandbox.probe(False) is not None, reason="bubblewrap cannot run here")
def test_a_published_row_graded_in_a_real_local_checkout(tmp_path, calc_repo):
    """The row carries only the harness's fields; local mode runs its eval script's test command in /app and
    the harness's parser and rule grade it: the gold patch resolves, the empty one does not."""
    from agent.bench.environments import EnvSpec
    from agent.bench.grading import grade_swe
    from agent.bench.local_env import LocalEnvironment
    from agent.bench.repos import RepoCache
    from tests.agent.bench.conftest import calc_row

    row = calc_row(calc_repo)
    row.pop("test_cmd")
    row.update(log_parser="parse_log_pytest", eval_type="pass_and_fail", eval_script=(
        "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\n"
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -rA -p no:cacheprovider test_add.py test_mul.py\n"
        ": '>>>>> End Test Output'\n"))  # fmt: skip
    task = swe_task_from_row(row, "t:1")
    cache = RepoCache(tmp_path / "cache")
    for name, patch, resolved in (("gold", row["patch"], True), ("nop", "", False)):
        spec = EnvSpec(tmp_path / name, app_source=lambda d: cache.checkout(task.repo, task.base_commit, d))
        env = LocalEnvironment(spec)
        env.start()
        g = grade_swe(task, patch, env, timeout_s=120)
        assert g.resolved is resolved, g.log
        assert g.tests["test_add.py::test_add"] == ("PASSED" if resolved else "FAILED")


def test_an_image_that_docker_would_read_as_a_flag_is_refused(tmp_path):
    with pytest.raises(TaskError, match="not a Docker image reference"):
        swe_task_from_row(published_row("parse_log_pytest", "a/b", ["x"], [], image="--privileged"), "t:1")
    from agent.bench.tasks import load_terminal_task

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("exit 0\n")
    (tmp_path / "instruction.md").write_text("x\n")
    (tmp_path / "task.toml").write_text('[environment]\ndocker_image = "--privileged"\n')
    with pytest.raises(TaskError, match="docker_image"):
        load_terminal_task(tmp_path)
    from agent.bench.docker_env import DockerEnvironment
    from agent.bench.environments import EnvSpec, InfraError

    with pytest.raises(InfraError, match="not a Docker image reference"):
        DockerEnvironment(EnvSpec(tmp_path / "t", image="-v/:/host")).image()


def test_a_harness_task_repo_folder_is_read_with_the_harness_s_reader(tmp_path):
    """`glm5 bench swe path/to/task-repo`: tasks/<id>/ as the harness lays them out, each row with its Dockerfile
    (where local mode finds the Python version)."""
    d = tmp_path / "repo" / "tasks" / "sympy__sympy-20590"
    d.mkdir(parents=True)
    (d / "task.yaml").write_text("instance_id: sympy__sympy-20590\nrepo: sympy/sympy\nbase_commit: abc\n"
                                 "version: '1.7'\nimage: swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest\n"
                                 "log_parser: parse_log_sympy\neval_type: pass_and_fail\nsplit: test\n")  # fmt: skip
    (d / "tests.json").write_text('{"FAIL_TO_PASS": ["test_immutable"], "PASS_TO_PASS": ["test_structure"]}')
    (d / "problem_statement.md").write_text("Symbol instances have __dict__ since 1.7?\n")
    (d / "gold.patch").write_text("diff --git a/x b/x\n")
    (d / "test.patch").write_text("diff --git a/t b/t\n")
    (d / "eval.sh").write_text("#!/bin/bash\n: '>>>>> Start Test Output'\nbin/test -C --verbose sympy/core/tests/"
                               "test_basic.py\n: '>>>>> End Test Output'\n")  # fmt: skip
    (d / "Dockerfile").write_text("FROM sweb.env.py.x86_64.abc:latest\nRUN conda create -n testbed python=3.9 -y\n")
    from agent.bench.tasks import load_swe_tasks

    [task] = load_swe_tasks(tmp_path / "repo")
    assert task.instance_id == "sympy__sympy-20590" and task.python == "3.9" and task.FAIL_TO_PASS == ("test_immutable",)
    assert harness_specs.parser_name(task) == "parse_log_sympy" and task.version == "1.7"
    assert task_test_cmd(task) == "bin/test -C --verbose sympy/core/tests/test_basic.py"
    from agent.bench.trial import TrialConfig, hidden_from_trials

    assert (tmp_path / "repo" / "tasks").resolve() in hidden_from_trials(task, TrialConfig())  # every gold.patch
