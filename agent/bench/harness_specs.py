"""SWE-bench rows as the official harness publishes them, graded with the harness's own parsers and rules.

A row of the SWE-bench 5.x datasets (SWE-bench, Lite, Verified, Multilingual, Multimodal; a task repo's
`tasks/<id>/`) carries what it takes to run it: `image` (the harness's `sweb.eval.x86_64.<id>` image),
`eval_script` (the script the harness runs in it: reset the test files, apply test_patch, the test command
between the `>>>>> Start Test Output` / `>>>>> End Test Output` markers), `log_parser` (a name in the harness's
PARSER_REGISTRY) and `eval_type` (pass_and_fail, or fail_only for suites whose logs list only failures).
This module reads those fields with the `swebench` package itself (an optional extra, `glm5[swebench]`: it pulls
in datasets, docker, modal and more, which a user of `glm5 code` does not need), never a copy of its tables:
    test_command        the test command of the eval script (what glm5 runs in /app in local mode)
    harness_parser      a glm5 Parser (log -> statuses) calling the harness's parser with the row's TestSpec
    harness_statuses    the harness's get_logs_eval on the log framed as its eval script frames it
    harness_judge       the harness's get_eval_tests_report + get_resolution_status -> a glm5 Grade
    harness_report      the harness's get_eval_report on the same log (what `swebench report` would say)
    image_name          the harness's image naming (ImageSpec.name) for a row without an `image`
    python_version      the Python a row's environment asks for (its Dockerfile's `python=3.9`), for local mode
    local_setup         local mode's setup for such a row: its Dockerfile's pip (and conda-as-pip) installs and
                        its eval script's install step; the rest of the Dockerfile is not honoured locally
What it does not know: how to build the harness's images (the task repo's Dockerfiles do that) or run docker.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from agent.bench.grades import MISSING, RESOLVED, UNRESOLVED, Grade

EXTRA_HINT = "pip install 'glm5[swebench]'"
START, END, EXIT = ">>>>> Start Test Output", ">>>>> End Test Output", ">>>>> Test Exit Code"


class HarnessMissing(RuntimeError):
    """The `swebench` package is needed for this row and is not installed."""


def _swebench():
    try:
        import swebench.harness.grading as grading
        import swebench.harness.log_parsers as parsers
    except ImportError as e:
        raise HarnessMissing(f"this SWE-bench row is graded by the official harness's parsers, which need the "
                             f"swebench package: {EXTRA_HINT} ({e})") from None  # fmt: skip
    return grading, parsers


def available() -> bool:
    try:
        _swebench()
    except HarnessMissing:
        return False
    return True


@lru_cache(maxsize=1)
def parser_names() -> tuple[str, ...]:
    """Every parser the installed harness has (PARSER_REGISTRY's names, e.g. parse_log_sympy)."""
    return tuple(_swebench()[1].PARSER_REGISTRY)


def is_harness_parser(name: str | None) -> bool:
    return bool(name) and name.startswith("parse_log_")


@lru_cache(maxsize=1)
def repo_parsers() -> dict[str, str]:
    """owner/name -> the registry name of the parser the harness maps that repository to (MAP_REPO_TO_PARSER_*)."""
    registry = _swebench()[1].PARSER_REGISTRY
    by_fn: dict[Any, str] = {}
    for name, fn in registry.items():
        by_fn.setdefault(fn, name)  # aliases (parse_log_sqlfluff = parse_log_pytest) share one function
    out: dict[str, str] = {}
    for lang in ("python", "javascript", "c", "go", "java", "php", "ruby", "rust"):
        mod = importlib.import_module(f"swebench.harness.log_parsers.{lang}")
        for table in (v for k, v in vars(mod).items() if k.startswith("MAP_REPO_TO_PARSER")):
            for repo, fn in table.items():
                if fn in by_fn:
                    out[repo] = by_fn[fn]
    return out


def parser_name(task: Any) -> str | None:
    """The harness parser for `task`: its `log_parser` when that is a harness name, else (for a row carrying the
    harness's eval_script) the one the harness maps its repository to; None when the row is not the harness's."""
    if is_harness_parser(task.log_parser):
        return task.log_parser
    if task.eval_script and not task.log_parser:
        return repo_parsers().get(task.repo)
    return None


def uses_harness(task: Any) -> bool:
    return parser_name(task) is not None


def eval_type(task: Any) -> str:
    if task.eval_type:
        return task.eval_type
    from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType

    return (EvalType.FAIL_ONLY if task.repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL).value


def test_spec(task: Any):
    """The harness's TestSpec for `task` (what its parsers and report functions read)."""
    from swebench.types import TestSpec

    return TestSpec(instance_id=task.instance_id, image=task.image or image_name(task.instance_id),
                    eval_script_list=[], repo=task.repo, version=task.version,
                    FAIL_TO_PASS=list(task.FAIL_TO_PASS), PASS_TO_PASS=list(task.PASS_TO_PASS),
                    log_parser=parser_name(task) or "", eval_type=eval_type(task))  # fmt: skip


def harness_parser(name: str, task: Any):
    """A glm5 Parser (log -> {test: status}) that is the harness's parser `name` for `task`."""
    registry = _swebench()[1].PARSER_REGISTRY
    if name not in registry:
        raise ValueError(f"unknown harness log_parser {name!r}; the installed swebench has: {', '.join(registry)}")
    fn, spec = registry[name], test_spec(task)
    return lambda log: fn(log, spec)


# -- the eval script -------------------------------------------------------------------------------------------


def _marker(line: str, marker: str) -> bool:
    s = line.strip()
    return marker in s and (s.startswith((":", "echo")))


def test_command(eval_script: str) -> str | None:
    """The command(s) between the eval script's start and end markers (the test command the harness runs)."""
    lines = eval_script.splitlines()
    start = next((i for i, s in enumerate(lines) if _marker(s, START)), None)
    end = next((i for i, s in enumerate(lines) if _marker(s, END) and start is not None and i > start), None)
    if start is None or end is None:
        return None
    body = [s for s in lines[start + 1 : end] if s.strip() and "SWEBENCH_TEST_EXIT_CODE" not in s]
    return "\n".join(body) or None


def frame(log: str, returncode: int | None) -> str:
    """`log` (the test command's output) as the harness's eval script writes it: between its markers, the exit
    code after the end marker."""
    tail = f"{EXIT}: {returncode}\n" if returncode is not None else ""
    return f"+ : '{START}'\n{log}\n+ : '{END}'\n{tail}"


# -- grading ---------------------------------------------------------------------------------------------------


def _with_log_file(text: str, fn):
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        return fn(f.name)


def harness_statuses(task: Any, log: str, returncode: int | None, framed: bool = False) -> tuple[dict[str, str], bool]:
    """The harness's get_logs_eval on the log (framed as its eval script frames it, unless it is the eval script's
    own output): (status map, whether the harness believes the run)."""
    grading, _ = _swebench()
    text = log if framed else frame(log, returncode)
    return _with_log_file(text, lambda p: grading.get_logs_eval(test_spec(task), p))


def eval_script(task: Any) -> str:
    """The row's eval script as the harness runs it (make_test_spec: the test command's exit code recorded after
    the end marker)."""
    from swebench.harness.utils import make_test_spec

    row = {"instance_id": task.instance_id, "image": task.image or image_name(task.instance_id),
           "eval_script": task.eval_script, "repo": task.repo, "version": task.version,
           "FAIL_TO_PASS": list(task.FAIL_TO_PASS), "PASS_TO_PASS": list(task.PASS_TO_PASS),
           "log_parser": parser_name(task) or "", "eval_type": eval_type(task)}  # fmt: skip
    return make_test_spec(row).eval_script


def harness_report(task: Any, model_patch: str | None, framed_log: str) -> dict[str, Any]:
    """The harness's own report for `task` on a log in its format (get_eval_report, tests included)."""
    grading, _ = _swebench()
    pred = {"instance_id": task.instance_id, "model_name_or_path": "glm5", "model_patch": model_patch}
    return _with_log_file(framed_log, lambda p: grading.get_eval_report(test_spec(task), pred, p, True))


def harness_judge(task: Any, statuses: dict[str, str]):
    """A glm5 Grade from the harness's resolution rule on a status map (its eval_type, its prefix matching)."""
    from swebench.harness.constants import EvalType, ResolvedStatus

    grading, _ = _swebench()
    gold = {"FAIL_TO_PASS": list(task.FAIL_TO_PASS), "PASS_TO_PASS": list(task.PASS_TO_PASS)}
    report = grading.get_eval_tests_report(statuses, gold, eval_type=EvalType(eval_type(task)))
    resolved = grading.get_resolution_status(report) == ResolvedStatus.FULL.value
    g = Grade(RESOLVED if resolved else UNRESOLVED, resolved, 1.0 if resolved else 0.0)
    g.fail_to_pass = {k: list(report["FAIL_TO_PASS"][k]) for k in ("success", "failure")}
    g.pass_to_pass = {k: list(report["PASS_TO_PASS"][k]) for k in ("success", "failure")}
    for case in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS):
        key = grading._resolve_case(case, statuses) if hasattr(grading, "_resolve_case") else case
        g.tests[case] = statuses.get(key, MISSING) if key is not None else MISSING
    if not resolved:
        failing = g.failing_tests
        g.reason = "failing: " + ", ".join(failing[:10]) + (" ..." if len(failing) > 10 else "")
    return g


# -- images and environments -----------------------------------------------------------------------------------


def image_name(instance_id: str, namespace: str | None = None, tag: str = "latest") -> str:
    """The harness's name for a row's evaluation image: sweb.eval.x86_64.<id>:<tag> (lower case; with a
    registry namespace, `__` becomes `_1776_`), from its own ImageSpec."""
    try:
        from swebench.image_builder.image_spec import ImageSpec
    except ImportError:
        key = f"sweb.eval.x86_64.{instance_id}:{tag}"
        return (f"{namespace}/{key}".replace("__", "_1776_") if namespace else key).lower()
    return ImageSpec(instance_id=instance_id, dockerfile="-", namespace=namespace, tag=tag).name


_CONDA_PY = re.compile(r"\bconda create\b[^\n]*?\bpython=?=?(\d+\.\d+)")
_FROM_PY = re.compile(r"^FROM\s+\S*python:(\d+\.\d+)", re.M | re.I)


def python_version(dockerfile: str) -> str | None:
    """The Python a task's environment is built with: `conda create ... python=3.9` or `FROM python:3.9`."""
    m = _CONDA_PY.search(dockerfile) or _FROM_PY.search(dockerfile)
    return m.group(1) if m else None


def load_task_repo(folder: Path) -> list[tuple[dict[str, Any], str]]:
    """(row, where) for every task of a harness task repo (`tasks/<id>/task.yaml` ...), read with the harness's
    own reader; each row gets its Dockerfile as `dockerfile` (its environment, for the Python version)."""
    try:
        from swebench.task.repo import load_task, task_dirs
    except ImportError as e:
        raise HarnessMissing(f"{folder} is a SWE-bench task repo; reading it needs {EXTRA_HINT} ({e})") from None
    out = []
    for d in task_dirs(folder):
        row = load_task(d)
        if (d / "Dockerfile").is_file():
            row["dockerfile"] = (d / "Dockerfile").read_text(encoding="utf-8")
            row["task_dir"] = str(d.resolve())  # its build context (docker mode builds the image where it is missing)
        for k in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            if isinstance(row.get(k), str):
                row[k] = json.loads(row[k])
        out.append((row, str(d / "task.yaml")))
    return out


_PIP = re.compile(r"(?:python\d*(?:\.\d+)? -m )?pip3? install\b[^\n;&|]*")
_CONDA_CREATE = re.compile(r"\bconda create\b([^\n;&|]*)")


def _conda_as_pip(args: str) -> str | None:
    """`conda create -n testbed python=3.9 'numpy==1.19.2' pytest -y` -> `python -m pip install numpy==1.19.2
    pytest` (conda's `name=1.2` is pip's `name==1.2.*`); None when it names no package beside Python."""
    words = [w.strip("'\"") for w in args.split()]
    pkgs, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("-n", "--name", "-c", "--channel", "-p", "--prefix"):
            skip = True
            continue
        if w.startswith("-") or w.startswith("python=") or w.startswith("python==") or w == "python":
            continue
        name, _, ver = w.partition("=")
        if ver and not ver.startswith("="):
            w = f"{name}=={ver}.*" if ver.count(".") < 2 else f"{name}=={ver}"
        pkgs.append(w)
    return ("python -m pip install " + " ".join(f"'{p}'" for p in pkgs)) if pkgs else None


def install_commands(eval_script: str) -> list[str]:
    """The eval script's own install step (the spec's `install`, e.g. `python -m pip install -e .`): its pip
    lines before the test patch goes in."""
    head = eval_script.split("git apply", 1)[0]
    return [m.group(0).strip() for m in _PIP.finditer(head)]


ANSWER_FILES = ("gold.patch", "test.patch", "tests.json", "eval.sh", "hints.md")  # never in a build context


def build_context(task: Any, cache_dir: Path) -> Path | None:
    """A row's task folder as a Docker build context, less what would give the answer away (a Dockerfile can
    `COPY . /x`: the agent would find the gold patch in its image); None for a row without one."""
    src = task.extra.get("task_dir")
    if not isinstance(src, str) or not (Path(src) / "Dockerfile").is_file():
        return None
    digest = hashlib.sha256(f"{src}\0{task.extra.get('dockerfile', '')}".encode()).hexdigest()[:16]
    ctx = Path(cache_dir).resolve() / "contexts" / digest
    if not ctx.is_dir():
        ctx.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=ctx.parent, prefix=f".{digest}-")) / "ctx"
        shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns(*ANSWER_FILES, "problem_assets"))
        try:
            tmp.rename(ctx)
        except OSError:  # another trial made it first
            pass
        shutil.rmtree(tmp.parent, ignore_errors=True)
    return ctx


def local_setup(task: Any) -> str | None:
    """For local mode, a setup for a row as the harness publishes it: the pip installs of its environment's
    Dockerfile (`conda create` packages as pip requirements, then each `pip install`) and its eval script's install
    step, in order. None for a row that is not the harness's or already carries its own `setup`."""
    if task.setup or not task.eval_script:
        return None
    dockerfile = task.extra.get("dockerfile") or ""
    steps: list[str] = []
    for m in re.finditer(f"{_CONDA_CREATE.pattern}|{_PIP.pattern}", dockerfile):
        text = m.group(0)
        step = _conda_as_pip(m.group(1)) if text.lstrip().startswith("conda") else text.strip()
        if step and "-r $HOME" not in step and "-r /root" not in step:
            steps.append(step)
    steps += install_commands(task.eval_script)
    return "\n".join(dict.fromkeys(steps)) or None
