"""Grading, as the SWE-bench harness does it, and Harbor's verifier reward.

SWE: in a fresh checkout of base_commit (the caller's environment), apply the prediction (`git apply`, then
`git apply --3way`, then `patch --fuzz=5`), reset the files test_patch touches and apply it, run the tests,
parse each test's status from the log. Resolved iff every FAIL_TO_PASS test passes (PASSED or XFAIL) and every
PASS_TO_PASS test is maintained (PASSED, XFAIL or SKIPPED); a test absent from the log has failed
(`swebench.harness.grading`). Checks the harness 5.x added: a run with no parsed test and no sign the suite
started is not a run (infra_error here, never a pass); a log with no failure over a failing exit code is not
believed (unresolved). With `flaky_reruns` (0 by default: the harness grades the first run, and code an agent
wrote can fail once and pass on a rerun on purpose), a failing verdict reruns the tests: a test that passes in any
run counts as passed and is listed in `flaky_tests`.

Terminal: after the agent, tests/ is copied to /tests and `bash /tests/test.sh` runs; the reward is the float in
/logs/verifier/reward.txt, or reward.json's "reward" (else the mean of its named rewards). No reward file is an
infra_error (the verifier failed), never a zero.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from contextlib import nullcontext
from pathlib import Path

from unidiff import PatchSet
from unidiff.constants import RE_DIFF_GIT_HEADER
from unidiff.errors import UnidiffParseError

from agent.bench import harness_specs
from agent.bench.environments import APP, VERIFIER_LOGS, Environment, ExecResult, InfraError
from agent.bench.grades import MISSING, RESOLVED, UNRESOLVED, Grade, infra, judge
from agent.bench.log_parsers import ERROR, FAILED, PASSED, SKIPPED, SUITE_RAN, XFAIL, parser_for
from agent.bench.tasks import SWETask, TerminalTask
from agent.git_safe import GitError, git
from agent.host_files import read_beneath, unlink_beneath


def task_statuses(task: SWETask, log: str, returncode: int | None, test_cmd: str) -> tuple[dict, str]:
    """read_statuses for `task`: a row the official harness publishes is read by the harness itself."""
    name = harness_specs.parser_name(task)
    if name is None:
        return read_statuses(log, returncode, task.log_parser, test_cmd)
    statuses, believed = harness_specs.harness_statuses(task, log, returncode, framed=test_cmd == EVAL_SH)
    if believed:
        return statuses, ""
    if not harness_specs.harness_parser(name, task)(log):
        return {}, f"the tests did not run (exit code {returncode}, no test in the log)"
    return {}, f"the harness does not believe the log (exit code {returncode} with no failure, or its markers)"


def judge_task(task: SWETask, statuses: dict[str, str]) -> Grade:
    if harness_specs.uses_harness(task):
        return harness_specs.harness_judge(task, statuses)
    return judge(task.FAIL_TO_PASS, task.PASS_TO_PASS, statuses)


def read_statuses(log: str, returncode: int | None, parser_name: str | None, test_cmd: str) -> tuple[dict, str]:
    """(status map, problem); problem is "" when the run is believable, else why it is not."""
    _, parse = parser_for(parser_name, test_cmd)
    statuses = parse(log)
    if not statuses and not SUITE_RAN.search(log):
        return {}, f"the tests did not run (exit code {returncode}, no test in the log)"
    if returncode not in (0, None) and statuses and not any(s in (FAILED, ERROR) for s in statuses.values()):
        return {}, f"the log reports no failure but the test command exited {returncode}"
    return statuses, ""


# -- SWE tasks -------------------------------------------------------------------------------------------------


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff touches (the new path; the old one for a deletion), read by unidiff. A patch whose hunks
    unidiff refuses (cut short, or a lone CR that text decoding made a line end) still names its files: its
    `diff --git` headers are read with unidiff's own pattern, so a malformed hunk cannot hide a path."""
    try:
        paths = [f.path for f in PatchSet(patch, metadata_only=True)]
    except UnidiffParseError:
        heads = (RE_DIFF_GIT_HEADER.match(line) for line in patch.split("\n"))
        paths = [m.group("target").strip('"')[2:] for m in heads if m]
    return list(dict.fromkeys(paths))


def default_test_cmd(task: SWETask) -> str:
    """pytest over the test files test_patch touches and the files the test ids name (the whole suite if none)."""
    files = [f for f in patch_files(task.test_patch) if f.endswith(".py")]
    for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS):
        if "::" in t and t.split("::")[0] not in files:
            files.append(t.split("::")[0])
    return "python -m pytest -rA -p no:cacheprovider " + " ".join(shlex.quote(f) for f in files)


APPLY_STEPS = ("git apply", "git apply --3way", "patch --fuzz")


def _apply_test_patch(task: SWETask, env: Environment) -> str | None:
    """Put test_patch in: the files it touches go back to base_commit first (the prediction may have edited the
    tests). None when it applied, else git's log. The patch file lives in a host folder no trial sees, and what
    the prediction left at a test file's path is removed itself (a link is never followed)."""
    if not task.test_patch.strip():
        return None
    for f in patch_files(task.test_patch):
        if _host_git(env.app_dir, "cat-file", "-e", f"{task.base_commit}:{f}")[0] == 0:
            _host_git(env.app_dir, "checkout", "-q", task.base_commit, "--", f)
        else:
            try:
                unlink_beneath(env.app_dir, f)
            except OSError:
                pass  # not a path inside /app: git apply refuses it below
    with tempfile.TemporaryDirectory(prefix="glm5-grade-") as private:
        host = Path(private) / "test.patch"
        host.write_text(task.test_patch if task.test_patch.endswith("\n") else task.test_patch + "\n")
        rc, log = _host_git(env.app_dir, "apply", "-v", str(host))
    return None if rc == 0 else log


def _suite_runs_without_prediction(task: SWETask, env: Environment, timeout_s: float) -> tuple[bool, str]:
    """Back to base_commit (tracked files restored, new files removed; ignored build output kept), test_patch
    in, the tests run once: (whether any test ran, the log)."""
    with frozen(env):
        _host_git(env.app_dir, "checkout", "-q", "-f", task.base_commit, "--", ".")
        _host_git(env.app_dir, "clean", "-fdq")
        applied = _apply_test_patch(task, env) is None
    if not applied:
        return False, "(without the prediction, test_patch did not apply)"
    res, cmd = run_tests(env, task, timeout_s)
    statuses, _ = task_statuses(task, res.output, res.returncode, cmd)
    return bool(statuses), f"$ {cmd}  # without the prediction\n{res.output}\n[exit code {res.returncode}]"


def frozen(env: Environment):
    """While the host touches /app or /logs, nothing inside runs (DockerEnvironment.frozen pauses its
    container; in the local environment nothing outlives a command, so there is nothing to pause)."""
    f = getattr(env, "frozen", None)
    return f() if callable(f) else nullcontext()


def _host_git(app: Path, *args: str) -> tuple[int, str]:
    try:
        r = git(app, *args, check=False, timeout=300)
    except (GitError, subprocess.TimeoutExpired) as e:
        return 1, str(e)
    return r.returncode, r.stdout + r.stderr


def apply_patch(env: Environment, text: str, name: str, inside: str = VERIFIER_LOGS) -> tuple[str | None, str]:
    """Apply `text` to /app trying each of APPLY_STEPS in turn; (the method that worked or None, log).

    git runs host-side through git_safe (the checkout's .git is read-only inside); `patch` runs inside the
    environment, where a hostile path in the diff can reach nothing but /app. The host's copy of the diff is in a
    folder no trial sees (the scratch folder is the trial's: a link planted there was written through).
    """
    with tempfile.TemporaryDirectory(prefix="glm5-grade-") as private:
        host = Path(private) / name
        host.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        env.copy_in(host, f"{inside}/{name}")
        return _apply_steps(env, host, name, inside)


def _apply_steps(env: Environment, host: Path, name: str, inside: str) -> tuple[str | None, str]:
    """APPLY_STEPS in turn: git on the host's copy `host`, `patch` on the environment's copy at inside/name."""
    log = []
    for method in APPLY_STEPS:
        if method == "patch --fuzz":
            cmd = f"patch --batch --fuzz=5 -p1 -i {inside}/{name}"
            r = env.exec(cmd, cwd=APP, timeout_s=120)
            rc, out = (r.returncode if r.returncode is not None else 1), r.output
        else:
            cmd = f"git apply -v {'--3way ' if '3way' in method else ''}{name}"
            rc, out = _host_git(env.app_dir, "apply", "-v", *(["--3way"] if "3way" in method else []), str(host))
        log.append(f"$ {cmd}\n{out}")
        if rc == 0:
            return method, "\n".join(log)
        # a failed try may leave conflict markers or .rej files: the next one starts from a clean checkout
        _host_git(env.app_dir, "reset", "-q", "--hard")
        _host_git(env.app_dir, "clean", "-qfdx")
    return None, "\n".join(log)


def task_test_cmd(task: SWETask) -> str:
    """The row's own test_cmd, else the test command of the harness's eval script, else pytest over its files."""
    if task.test_cmd:
        return task.test_cmd
    if task.eval_script:
        cmd = harness_specs.test_command(task.eval_script)
        if cmd:
            return cmd
    return default_test_cmd(task)


EVAL_SH = "bash /logs/verifier/eval.sh"  # the harness's own eval script, run as it runs it (docker, its image)


def runs_eval_script(task: SWETask, env: Environment) -> bool:
    """In the harness's own image (docker, /testbed copied out of it) the harness's eval script runs whole: it
    resets the test files, applies test_patch and runs the tests exactly as `swebench eval` does."""
    return bool(task.eval_script) and getattr(env, "name", "") == "docker" and getattr(env, "harness_image", False)


def run_tests(env: Environment, task: SWETask, timeout_s: float) -> tuple[ExecResult, str]:
    if runs_eval_script(task, env):
        (env.logs / "verifier").mkdir(parents=True, exist_ok=True)
        (env.logs / "verifier" / "eval.sh").write_text(harness_specs.eval_script(task), encoding="utf-8")
        return env.exec(EVAL_SH, cwd=env.workdir, timeout_s=timeout_s), EVAL_SH
    cmd = task_test_cmd(task)
    return env.exec(cmd, cwd=APP, timeout_s=timeout_s), cmd


def grade_swe(task: SWETask, patch_text: str, env: Environment, *, timeout_s: float = 1800,
              flaky_reruns: int = 0) -> Grade:  # fmt: skip
    """Grade `patch_text` in `env`, a started environment whose /app is a fresh checkout of task.base_commit."""
    out: list[str] = []
    if patch_text.strip():
        method, log = apply_patch(env, patch_text, "prediction.diff")
        out.append(log)
        if method is None:
            g = Grade(UNRESOLVED, False, reason="the patch does not apply", patch_applied=False, log="\n".join(out))
            g.tests = {t: MISSING for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS)}
            g.fail_to_pass["failure"], g.pass_to_pass["failure"] = list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS)
            return g
    else:
        method = None
    with frozen(env):
        failed = None if runs_eval_script(task, env) else _apply_test_patch(task, env)
    if failed is not None:
        return infra("test_patch does not apply (the task is broken)", "\n".join([*out, failed]))
    grade = None
    flaky: set[str] = set()
    for _ in range(1 + max(0, flaky_reruns)):
        res, cmd = run_tests(env, task, timeout_s)
        out.append(f"$ {cmd}\n{res.output}\n[exit code {res.returncode}{', timed out' if res.timed_out else ''}]")
        if res.timed_out:
            g = Grade(UNRESOLVED, False, reason=f"the tests timed out after {timeout_s:g}s")
        else:
            statuses, problem = task_statuses(task, res.output, res.returncode, cmd)
            if problem and not statuses and "did not run" in problem and not patch_text.strip():
                g = infra(problem)
            elif problem and not statuses and "did not run" in problem:
                # the prediction may be what stops the suite (a conftest.py that exits): an infra error would
                # leave the task out of the resolved rate. Without the prediction, does the suite run?
                runs, log = _suite_runs_without_prediction(task, env, timeout_s)
                out.append(log)
                g = (Grade(UNRESOLVED, False, reason=f"{problem} with the prediction applied; they run without it")
                     if runs else infra(problem))  # fmt: skip
            elif problem:
                g = Grade(UNRESOLVED, False, reason=problem)
            else:
                g = judge_task(task, statuses)
        g.test_returncode = res.returncode
        if grade is None:
            grade = g
        elif g.tests and grade.tests:
            flaky |= {t for t in g.tests if g.tests[t] != grade.tests.get(t)}
            merged = {t: (g.tests[t] if g.tests[t] in (PASSED, XFAIL) else grade.tests[t]) for t in grade.tests}
            grade = judge_task(task, merged)
            grade.test_returncode = res.returncode
        if grade.status != UNRESOLVED or not grade.tests:
            break
    assert grade is not None
    grade.flaky_tests = sorted(flaky)
    grade.patch_applied = True if patch_text.strip() else None
    grade.apply_method = method
    grade.log = "\n".join(out)
    if not patch_text.strip() and grade.status == RESOLVED:
        grade.reason = "resolved with an empty patch (the task's tests already pass at base_commit)"
    return grade


# -- terminal tasks --------------------------------------------------------------------------------------------


def _verifier_file(path: Path) -> str | None:
    """A file the verifier wrote, read on the host: only a regular file reached without a link (one the agent
    planted, at the file or at /logs/verifier itself, could name any host file, one the sandbox hides), at most
    1 MB; None when there is none."""
    data = read_beneath(path.parent.parent, Path(path.parent.name) / path.name, 2**20)
    return None if data is None else data.decode("utf-8", errors="replace")


def clear_verifier_dir(verifier_dir: Path) -> None:
    """Empty /logs/verifier before the verifier runs: the agent could write there (its reward.txt, reward.json,
    ctrf.json), and only what the verifier writes is its verdict."""
    if verifier_dir.is_symlink() or (verifier_dir.exists() and not verifier_dir.is_dir()):
        verifier_dir.unlink()
    elif verifier_dir.exists():
        shutil.rmtree(verifier_dir)
    verifier_dir.mkdir(parents=True)


def read_reward(verifier_dir: Path) -> tuple[float | None, dict[str, float], str]:
    """(reward, named rewards, problem) from what the verifier wrote (regular files only)."""
    txt, js = _verifier_file(verifier_dir / "reward.txt"), _verifier_file(verifier_dir / "reward.json")
    if txt is not None:
        try:
            r = float(txt.strip())
        except ValueError:
            return None, {}, f"reward.txt holds {txt[:40]!r}, not a number"
        return r, {"reward": r}, ""
    if js is not None:
        try:
            data = json.loads(js)
            named = {str(k): float(v) for k, v in data.items()}
        except (ValueError, TypeError, AttributeError):
            return None, {}, "reward.json is not an object of numbers"
        if not named:
            return None, {}, "reward.json is empty"
        r = named["reward"] if "reward" in named else sum(named.values()) / len(named)
        return r, named, ""
    return None, {}, "the verifier wrote no /logs/verifier/reward.txt or reward.json (a regular file)"


def _ctrf(verifier_dir: Path) -> dict[str, str]:
    """Per-test statuses from a CTRF report (Harbor's template writes ctrf.json), when there is one."""
    try:
        tests = json.loads(_verifier_file(verifier_dir / "ctrf.json") or "")["results"]["tests"]
        names = {"passed": PASSED, "failed": FAILED, "skipped": SKIPPED, "pending": SKIPPED}
        return {t["name"]: names.get(t.get("status"), ERROR) for t in tests}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def grade_terminal(task: TerminalTask, env: Environment, verifier_dir: Path) -> Grade:
    """Copy the tests in, run the verifier, read its reward. `verifier_dir` is the host side of /logs/verifier."""
    try:
        with frozen(env):
            clear_verifier_dir(verifier_dir)  # what the agent left there is not the verifier's verdict
        env.copy_in(task.tests_dir, "/tests")
    except (OSError, InfraError) as e:
        return infra(f"could not copy the tests in: {e}")
    res = env.exec("bash /tests/test.sh", cwd=task.workdir, timeout_s=task.verifier_timeout_s, env=task.verifier_env)
    log = f"$ bash /tests/test.sh\n{res.output}\n[exit code {res.returncode}{', timed out' if res.timed_out else ''}]"
    with frozen(env):
        reward, named, problem = read_reward(verifier_dir)
        tests = _ctrf(verifier_dir)
    if reward is None:
        why = f"the verifier timed out after {task.verifier_timeout_s:g}s" if res.timed_out else problem
        return infra(why, log)
    g = Grade(RESOLVED if reward >= 1.0 else UNRESOLVED, reward >= 1.0, reward, rewards=named, log=log)
    g.tests = tests
    g.fail_to_pass["failure"] = [t for t, s in g.tests.items() if s in (FAILED, ERROR)]
    g.fail_to_pass["success"] = [t for t, s in g.tests.items() if s == PASSED]
    g.test_returncode = res.returncode
    if not g.resolved:
        g.reason = f"reward {reward:g}"
    return g
