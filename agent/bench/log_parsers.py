"""Per-test statuses from a test run's log, one parser per test framework (SWE-bench Multilingual's languages).

Each parser maps test name -> status (PASSED, FAILED, SKIPPED, ERROR, XFAIL: the SWE-bench harness's names), and
names tests as that harness does, so FAIL_TO_PASS / PASS_TO_PASS lists from SWE-bench match:
    pytest     `-rA` short summary lines `PASSED path::test`, `FAILED path::test - msg`, `ERROR path` (collection)
    unittest   verbose `test_x (mod.Class.test_x) ... ok | FAIL | ERROR | skipped '...'` (Django's runner too)
    go_test    `--- PASS: TestX (0.00s)` (subtests as TestX/sub)
    cargo      `test path::name ... ok | FAILED | ignored`
    jest       `--verbose`: `✓ name (3 ms)`, `✕ name`, `○ name`
    mocha      spec reporter: `✓ name`, `✔ name`, `N) name` (failing), `- name` (pending)
    junit_xml  every <testcase> of the JUnit XML reports the test command printed (Maven surefire, Gradle):
               `Class.method`
`parser_for(task)` picks the task's `log_parser`, else one guessed from its test command. Plugins add parsers
through `register_log_parsers(register, context)`: register(NAME, fn) (plugins written before that hook did it
through `register_benchmarks`: register("log_parser:NAME", fn), which still works).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable

from agent import plugin_registry

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
STATUSES = (PASSED, FAILED, SKIPPED, ERROR, XFAIL)
Parser = Callable[[str], dict[str, str]]

_PYTEST = re.compile(rf"^({'|'.join(STATUSES)}) (\S+)")
_SKIP_COUNT = re.compile(r"^\[\d+\]$")  # `SKIPPED [2] path:3: reason` is a summary, not a test


def parse_pytest(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in log.splitlines():
        m = _PYTEST.match(line)
        if m is None:
            continue
        status, name = m.groups()
        if status == SKIPPED and _SKIP_COUNT.match(name):
            continue
        out[name] = status
    return out


_UNITTEST = re.compile(r"^(.*?) \.\.\. (ok|OK|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$")
_UNITTEST_MAP = {"ok": PASSED, "OK": PASSED, "FAIL": FAILED, "ERROR": ERROR, "expected failure": XFAIL,
                 "unexpected success": FAILED}  # fmt: skip


def parse_unittest(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pending = None  # a test whose output came between its name and its verdict
    for raw in log.splitlines():
        line = raw.strip()
        m = _UNITTEST.match(line)
        if m:
            name, verdict = m.groups()
            out[name] = SKIPPED if verdict.startswith("skipped") else _UNITTEST_MAP[verdict]
            pending = None
            continue
        if " ... " in line:
            pending = line.split(" ... ")[0]
        elif pending and line in ("ok", "OK"):
            out[pending] = PASSED
            pending = None
        for prefix, status in (("FAIL: ", FAILED), ("ERROR: ", ERROR)):
            if line.startswith(prefix) and len(line.split()) > 1:
                out[line.split()[1]] = status
    return out


def _matched_lines(log: str, rx: re.Pattern, statuses: dict[str, str], strip: bool = False) -> dict[str, str]:
    """Each line (stripped) that `rx` matches: its `name` group (stripped too with `strip`) -> statuses[its `status`
    group]."""
    out = {}
    for line in log.splitlines():
        m = rx.match(line.strip())
        if m:
            out[m.group("name").strip() if strip else m.group("name")] = statuses[m.group("status")]
    return out


_GO = re.compile(r"^--- (?P<status>PASS|FAIL|SKIP): (?P<name>.+) \((.+)\)$")
_CARGO = re.compile(r"^test\s+(?P<name>\S+)\s+\.\.\.\s+(?P<status>ok|FAILED|ignored)$")
_JEST = re.compile(r"^(?P<status>✓|✕|○)\s(?P<name>.+?)(?:\s\((\d+\s*m?s)\))?$")


def parse_go_test(log: str) -> dict[str, str]:
    return _matched_lines(log, _GO, {"PASS": PASSED, "FAIL": FAILED, "SKIP": SKIPPED})


def parse_cargo(log: str) -> dict[str, str]:
    return _matched_lines(log, _CARGO, {"ok": PASSED, "FAILED": FAILED, "ignored": SKIPPED})


def parse_jest(log: str) -> dict[str, str]:
    return _matched_lines(log, _JEST, {"✓": PASSED, "✕": FAILED, "○": SKIPPED}, strip=True)


_MOCHA_PASS = re.compile(r"^[✓✔]\s(.+?)(?:\s\(\d+m?s\))?$")
_MOCHA_FAIL = re.compile(r"^\d+\)\s(.+)$")
_MOCHA_PENDING = re.compile(r"^-\s(.+)$")


def parse_mocha(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    in_failures = False  # after "N failing" mocha repeats the failures with their suites: skip that part
    for line in log.splitlines():
        s = line.strip()
        if re.match(r"^\d+ failing$", s):
            in_failures = True
        if in_failures:
            continue
        for pattern, status in ((_MOCHA_PASS, PASSED), (_MOCHA_FAIL, FAILED), (_MOCHA_PENDING, SKIPPED)):
            m = pattern.match(s)
            if m:
                out[m.group(1).strip()] = status
                break
    return out


_SUITE = re.compile(r"<testsuite\b(?!s).*?</testsuite>", re.S)  # each suite; a <testsuites> wrapper is skipped


def parse_junit_xml(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for block in _SUITE.findall(log):
        try:
            root = ET.fromstring(block)
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}.{case.get('name', '')}".strip(".")
            if case.find("failure") is not None:
                out[name] = FAILED
            elif case.find("error") is not None:
                out[name] = ERROR
            elif case.find("skipped") is not None:
                out[name] = SKIPPED
            else:
                out[name] = PASSED
    return out


PARSERS: dict[str, Parser] = {
    "pytest": parse_pytest,
    "unittest": parse_unittest,
    "django": parse_unittest,
    "go_test": parse_go_test,
    "cargo": parse_cargo,
    "jest": parse_jest,
    "mocha": parse_mocha,
    "junit_xml": parse_junit_xml,
    "maven": parse_junit_xml,
    "gradle": parse_junit_xml,
}

_GUESSES = (
    (re.compile(r"\bpytest\b|py\.test"), "pytest"),
    (re.compile(r"\bunittest\b|manage\.py test|runtests\.py"), "unittest"),
    (re.compile(r"\bgo test\b"), "go_test"),
    (re.compile(r"\bcargo (test|nextest)\b"), "cargo"),
    (re.compile(r"\bjest\b"), "jest"),
    (re.compile(r"\bmocha\b"), "mocha"),
    (re.compile(r"\bmvn\b|\bgradlew?\b"), "junit_xml"),
)

# Signs in a log that a test runner started and counted tests, for a run whose parse found nothing.
SUITE_RAN = re.compile(
    r"^=+ .*\b(passed|failed|error|skipped)\b.* in [\d.]+s|^Ran [1-9]\d* tests? in|^(ok|FAIL)\s+\S+\s+[\d.]+s$"
    r"|^test result: |Tests:\s+[1-9]\d*|[1-9]\d* passing|Tests run: [1-9]\d*",
    re.M,
)


def all_parsers() -> dict[str, Parser]:
    """Built-ins plus plugins' parsers (`register_log_parsers`, or the older `log_parser:NAME` benchmarks)."""
    try:
        return {**PARSERS, **plugin_registry.default_manager().log_parsers()}
    except Exception:  # noqa: BLE001 - a broken plugin must not stop grading with the built-ins
        return dict(PARSERS)


def guess_parser(test_cmd: str) -> str:
    for pattern, name in _GUESSES:
        if pattern.search(test_cmd):
            return name
    return "pytest"


def parser_for(name: str | None, test_cmd: str) -> tuple[str, Parser]:
    parsers = all_parsers() if name and name not in PARSERS else PARSERS
    chosen = name or guess_parser(test_cmd)
    if chosen not in parsers:
        raise ValueError(f"unknown log_parser {chosen!r}; known: {', '.join(sorted(parsers))}")
    return chosen, parsers[chosen]
