"""Our log parsers and resolution rule against the official `swebench` package on the same logs."""

from __future__ import annotations

import pytest

from agent.bench.grades import INFRA_ERROR, judge
from agent.bench.grading import read_statuses
from agent.bench.log_parsers import PARSERS, guess_parser, parse_junit_xml, parse_unittest

PYTEST_LOG = """\
============================= test session starts ==============================
collected 6 items

test_calc.py ..F.x                                                       [100%]

=========================== short test summary info ============================
PASSED test_calc.py::test_add
PASSED test_calc.py::test_param[1-2]
PASSED test_calc.py::test_param[a/b-c]
FAILED test_calc.py::test_sub - assert -1 == 1
SKIPPED [1] test_calc.py:10: no reason
XFAIL test_calc.py::test_x - reason
ERROR test_other.py - ImportError: cannot import name 'x'
=============== 1 failed, 3 passed, 1 skipped, 1 xfailed in 0.03s ===============
"""
UNITTEST_LOG = """\
test_add (test_calc.TestCalc.test_add) ... ok
test_sub (test_calc.TestCalc.test_sub) ... FAIL
test_skip (test_calc.TestCalc.test_skip) ... skipped 'because'
test_err (test_calc.TestCalc.test_err) ... ERROR
test_noisy (test_calc.TestCalc.test_noisy) ... printing things
ok

======================================================================
FAIL: test_sub (test_calc.TestCalc.test_sub)
----------------------------------------------------------------------
Ran 5 tests in 0.001s

FAILED (failures=1, errors=1, skipped=1)
"""
GO_LOG = """\
=== RUN   TestA
--- PASS: TestA (0.00s)
=== RUN   TestB
--- FAIL: TestB (0.01s)
    --- PASS: TestB/sub_case (0.00s)
--- SKIP: TestC (0.00s)
FAIL
FAIL\texample.com/m\t0.012s
"""
CARGO_LOG = """\
running 3 tests
test tests::adds ... ok
test tests::subtracts ... FAILED
test parse::roundtrip ... ok

test result: FAILED. 2 passed; 1 failed; 0 ignored
"""
JEST_LOG = """\
 PASS  src/a.test.js
  calc
    ✓ adds two numbers (3 ms)
    ✕ subtracts (1 ms)
    ○ skipped thing
Tests:       1 failed, 1 skipped, 1 passed, 3 total
"""

# (our parser, official parser name, log)
CASES = [
    ("pytest", "parse_log_pytest", PYTEST_LOG),
    ("unittest", "parse_log_django", UNITTEST_LOG),
    ("go_test", "parse_log_gotest", GO_LOG),
    ("cargo", "parse_log_cargo", CARGO_LOG),
    ("jest", "parse_log_jest", JEST_LOG),
]


@pytest.mark.parametrize("ours,theirs,log", CASES, ids=[c[0] for c in CASES])
def test_same_status_for_every_test_as_swebench(ours, theirs, log):
    registry = pytest.importorskip("swebench.harness.log_parsers").PARSER_REGISTRY
    mine = PARSERS[ours](log)
    official = registry[theirs](log, None)
    assert mine, "the parser found nothing"
    assert mine == official


@pytest.mark.parametrize("ours,theirs,log", CASES, ids=[c[0] for c in CASES])
def test_same_verdict_as_swebench(ours, theirs, log):
    g = pytest.importorskip("swebench.harness.grading")
    const = pytest.importorskip("swebench.harness.constants")
    statuses = PARSERS[ours](log)
    names = sorted(statuses)
    # every split of the log's tests into F2P / P2P, plus a test the log never mentions
    for mask in range(1 << len(names)):
        f2p = tuple(n for i, n in enumerate(names) if mask >> i & 1)
        p2p = tuple(n for i, n in enumerate(names) if not mask >> i & 1)
        for extra_f2p, extra_p2p in (((), ()), (("never_ran",), ()), ((), ("never_ran",))):
            mine = judge(f2p + extra_f2p, p2p + extra_p2p, statuses)
            report = g.get_eval_tests_report(
                statuses, {const.FAIL_TO_PASS: list(f2p + extra_f2p), const.PASS_TO_PASS: list(p2p + extra_p2p)}
            )
            official = g.get_resolution_status(report) == const.ResolvedStatus.FULL.value
            assert mine.resolved is official, (f2p, p2p, extra_f2p, extra_p2p)
            assert sorted(mine.fail_to_pass["failure"]) == sorted(report[const.FAIL_TO_PASS]["failure"])
            assert sorted(mine.pass_to_pass["failure"]) == sorted(report[const.PASS_TO_PASS]["failure"])


def test_truncated_parametrized_id_matches_like_swebench():
    statuses = {"t.py::test_p[log(photon)]": "PASSED"}
    assert judge(("t.py::test_p[log(photon",), (), statuses).resolved is True


def test_skipped_fail_to_pass_is_a_failure_but_skipped_pass_to_pass_is_kept():
    assert judge(("a",), (), {"a": "SKIPPED"}).resolved is False
    assert judge(("a",), ("b",), {"a": "PASSED", "b": "SKIPPED"}).resolved is True


def test_unittest_expected_failure_and_skip_reason():
    log = "test_x (m.T.test_x) ... expected failure\ntest_y (m.T.test_y) ... skipped 'no db'\n"
    assert parse_unittest(log) == {"test_x (m.T.test_x)": "XFAIL", "test_y (m.T.test_y)": "SKIPPED"}


def test_junit_xml_reports_from_maven_and_gradle():
    log = """[INFO] Running com.acme.CalcTest
<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="com.acme.CalcTest" tests="3" failures="1">
  <testcase classname="com.acme.CalcTest" name="adds" time="0.01"/>
  <testcase classname="com.acme.CalcTest" name="subtracts"><failure message="x"/></testcase>
  <testcase classname="com.acme.CalcTest" name="later"><skipped/></testcase>
</testsuite>
<testsuites><testsuite name="b"><testcase classname="B" name="boom"><error/></testcase></testsuite></testsuites>
"""
    assert parse_junit_xml(log) == {
        "com.acme.CalcTest.adds": "PASSED",
        "com.acme.CalcTest.subtracts": "FAILED",
        "com.acme.CalcTest.later": "SKIPPED",
        "B.boom": "ERROR",
    }


def test_guess_parser_from_the_command():
    assert guess_parser("python -m pytest -rA tests/") == "pytest"
    assert guess_parser("go test ./... -v") == "go_test"
    assert guess_parser("cargo test -- --nocapture") == "cargo"
    assert guess_parser("npx jest --verbose") == "jest"
    assert guess_parser("./gradlew test") == "junit_xml"
    assert guess_parser("python -m unittest -v") == "unittest"


def test_a_run_that_never_ran_is_not_a_pass():
    statuses, problem = read_statuses("bash: pytest: command not found\n", 127, None, "pytest -rA")
    assert statuses == {} and "did not run" in problem
    # pytest exit 5: collected nothing
    statuses, problem = read_statuses("===== no tests ran in 0.01s =====\n", 5, None, "pytest -rA")
    assert "did not run" in problem
    assert judge(("a",), (), statuses).resolved is False  # and even if judged, nothing passes


def test_log_claiming_success_over_a_failing_exit_code_is_not_believed():
    statuses, problem = read_statuses("PASSED t.py::test_a\n==== 1 passed in 0.1s ====\n", 1, None, "pytest")
    assert statuses == {} and "exited 1" in problem
    assert INFRA_ERROR == "infra_error"


def test_a_plugin_adds_a_log_parser(monkeypatch):
    import agent.plugin_registry as reg
    from agent.bench.log_parsers import parser_for

    class TapPlugin:
        def register_benchmarks(self, register, context):
            register(
                "log_parser:tap", lambda log: {ln[5:]: "PASSED" for ln in log.splitlines() if ln.startswith("ok - ")}
            )

    real = reg.PluginManager
    monkeypatch.setattr(reg, "default_manager", lambda: real(entry_points=False, extra=(TapPlugin(),)))
    name, parse = parser_for("tap", "prove -v")
    assert name == "tap" and parse("ok - adds\nnot ok - subs\n") == {"adds": "PASSED"}
    with pytest.raises(ValueError, match="unknown log_parser 'nope'"):
        parser_for("nope", "x")
