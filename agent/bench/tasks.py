"""Tasks as the benchmarks publish them: SWE-bench rows and Harbor (Terminal-Bench 2.0) task folders.

SWE-bench rows come as JSONL, a JSON list (or {"instances": [...]}) or the parquet of a `datasets` export; the
test lists FAIL_TO_PASS / PASS_TO_PASS may be JSON strings (as the harness stores them) or lists. glm5 adds three
optional fields a row may carry: `test_cmd` (how to run its tests; default pytest over the files test_patch
touches), `log_parser` (pytest, unittest, go_test, cargo, jest, mocha, junit_xml, or a plugin's) and `setup`
(a command or a requirements file, run once per repo and version in a cached virtual environment).
A row as the harness publishes it (SWE-bench 5.x: `image`, `eval_script`, `log_parser` such as parse_log_sympy,
`eval_type`), or a harness task repo folder (tasks/<id>/...), needs none of them: agent/bench/harness_specs.py.

A Harbor task is a folder: task.toml (schema 1.4: [task], [metadata], [agent], [verifier], [environment],
[solution]), instruction.md, environment/ (Dockerfile, files), tests/test.sh, solution/solve.sh.
Every error names the file, and the line or the field; the fields are checked by task_schema.py's pydantic models.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from agent.bench import harness_specs
from agent.bench.task_schema import MAX_ID, HarborToml, SWERow, good_id, problem

HARBOR_SCHEMAS = ("1.0", "1.1", "1.2", "1.3", "1.4")


class TaskError(ValueError):
    """A task file or folder is wrong; the message names the file and the line or field."""


class _Task:
    """What every task kind answers: its id (a folder name under the run)."""

    instance_id: str

    @property
    def task_id(self) -> str:
        return self.instance_id


@dataclass(frozen=True)
class SWETask(_Task):
    instance_id: str
    repo: str  # a local path, a git URL, or owner/name (mapped through --repos)
    base_commit: str
    problem_statement: str
    patch: str = ""  # the gold patch (the oracle's answer; never shown to the agent)
    test_patch: str = ""
    FAIL_TO_PASS: tuple[str, ...] = ()
    PASS_TO_PASS: tuple[str, ...] = ()
    version: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    test_cmd: str | None = None
    log_parser: str | None = None
    setup: str | None = None
    # the official harness's own fields (SWE-bench 5.x rows; agent/bench/harness_specs.py): its image, its eval
    # script (the test command comes from it), its eval type; `python` the version its environment is built with
    eval_script: str = ""
    image: str = ""
    eval_type: str = ""
    python: str = ""
    source: str = ""  # file:line the task came from, for error messages
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    kind = "swe"

    @property
    def text(self) -> str:
        """What the agent is told: the issue, and nothing of the tests or the fix."""
        return self.problem_statement


@dataclass(frozen=True)
class TerminalTask(_Task):
    instance_id: str  # the folder's name, or [task].name
    path: Path
    instruction: str
    config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    agent_timeout_s: float | None = None
    verifier_timeout_s: float = 600.0
    verifier_env: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    docker_image: str | None = None
    memory_mb: int | None = None
    cpus: int | None = None
    allow_internet: bool = False
    workdir: str = "/app"

    kind = "terminal"

    @property
    def text(self) -> str:
        return self.instruction

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


# -- SWE-bench rows --------------------------------------------------------------------------------------------


def swe_task_from_row(row: Any, where: str) -> SWETask:
    """One SWE-bench row (a dict) -> SWETask; `where` is `file:line` for errors."""
    try:
        r = SWERow.model_validate(row)
    except ValidationError as e:
        raise TaskError(f"{where}: {problem(e)}") from None
    except harness_specs.HarnessMissing as e:
        raise TaskError(f"{where}: {e}") from None
    known = {f for f in SWETask.__dataclass_fields__ if f not in ("source", "extra")}
    return SWETask(
        instance_id=r.instance_id,
        repo=r.repo,
        base_commit=r.base_commit,
        problem_statement=r.problem_statement,
        patch=r.patch or "",
        test_patch=r.test_patch or "",
        FAIL_TO_PASS=r.FAIL_TO_PASS,
        PASS_TO_PASS=r.PASS_TO_PASS,
        version=r.version or "",
        environment_setup_commit=r.environment_setup_commit or "",
        hints_text=r.hints_text or "",
        test_cmd=r.test_cmd or None,
        log_parser=r.log_parser or None,
        setup=r.setup or None,
        eval_script=r.eval_script or "",
        image=r.image or "",
        eval_type=r.eval_type or "",
        python=r.python or harness_specs.python_version(r.dockerfile or "") or "",
        source=where,
        extra={k: v for k, v in row.items() if k not in known},
    )


def _rows(path: Path) -> list[tuple[Any, str]]:
    """(row, "file:line") pairs; JSON lists and parquet count rows from 1; a harness task repo (a folder with
    tasks/<id>/task.yaml) is read with the harness's own reader."""
    if path.is_dir() and (path / "tasks").is_dir():
        try:
            return harness_specs.load_task_repo(path)
        except (harness_specs.HarnessMissing, OSError, ValueError) as e:
            raise TaskError(f"{path}: {e}") from None
    if not path.is_file():
        raise TaskError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise TaskError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
            raise TaskError(f"{path}: not a readable parquet file ({e})") from None
        return [(r, f"{path}:row {i}") for i, r in enumerate(rows, 1)]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise TaskError(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x})") from None
    if suffix == ".json" or text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise TaskError(f"{path}: not a task file (JSON nested too deep)") from None
        if isinstance(data, dict):
            data = data.get("instances", data.get("data", [data] if "instance_id" in data else None))
        if not isinstance(data, list):
            raise TaskError(f"{path}: expected a JSON list of tasks")
        return [(r, f"{path}:item {i}") for i, r in enumerate(data, 1)]
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((json.loads(line), f"{path}:{n}"))
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise TaskError(f"{path}:{n}: not a task (JSON nested too deep)") from None
    return out


def load_swe_tasks(path: str | Path) -> list[SWETask]:
    """Every task in the file, in order; a bad row raises TaskError naming file:line. Ids must be unique."""
    path = Path(path)
    tasks, seen = [], {}
    for row, where in _rows(path):
        t = swe_task_from_row(row, where)
        if t.instance_id in seen:
            raise TaskError(f"{where}: instance_id {t.instance_id!r} repeats {seen[t.instance_id]}")
        seen[t.instance_id] = where
        tasks.append(t)
    if not tasks:
        raise TaskError(f"{path}: no tasks in the file")
    return tasks


# -- Harbor task folders ---------------------------------------------------------------------------------------


def _harbor_toml(folder: Path, toml_path: Path) -> dict[str, Any]:
    """task.toml's data (none: {}), its schema version and steps checked, and the task's two required files."""
    data: dict[str, Any] = {}
    if toml_path.is_file():
        try:
            data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise TaskError(f"{toml_path}: not valid TOML: {e}") from None
    version = str(data.get("schema_version", data.get("version", "1.4")))
    if version not in HARBOR_SCHEMAS:
        raise TaskError(f"{toml_path}: schema_version {version!r} is not one glm5 reads ({', '.join(HARBOR_SCHEMAS)})")
    if data.get("steps"):
        raise TaskError(f"{toml_path}: multi-step tasks ([[steps]]) are not supported yet")
    if not (folder / "instruction.md").is_file():
        raise TaskError(f"{folder}: instruction.md is missing (what the agent is asked to do)")
    if not (folder / "tests" / "test.sh").is_file():
        raise TaskError(f"{folder}: tests/test.sh is missing (the verifier)")
    return data


def load_terminal_task(folder: str | Path) -> TerminalTask:
    """A Harbor task folder -> TerminalTask. Needs instruction.md and tests/test.sh; task.toml is optional."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise TaskError(f"{folder}: not a task folder")
    toml_path = folder / "task.toml"
    data = _harbor_toml(folder, toml_path)
    try:
        t = HarborToml.model_validate(data)
    except ValidationError as e:
        raise TaskError(f"{toml_path}: {problem(e)}") from None
    name = t.task.name or folder.name
    ident = re.sub(r"[^A-Za-z0-9_.\-]", "__", name)
    if not good_id(ident):
        raise TaskError(f"{toml_path}: [task].name {name[:80]!r} cannot name a folder (only dots, or over {MAX_ID})")
    env = t.environment
    return TerminalTask(
        instance_id=ident,
        path=folder,
        instruction=(folder / "instruction.md").read_text(encoding="utf-8"),
        config=data,
        agent_timeout_s=t.agent.timeout_sec,
        verifier_timeout_s=t.verifier.timeout_sec or 600.0,
        verifier_env=t.verifier.env or {},
        docker_image=env.docker_image,
        memory_mb=env.memory_mb,
        cpus=env.cpus,
        allow_internet=env.allow_internet or env.network_mode == "public",
        workdir=str(env.workdir or "/app"),
    )


def load_terminal_tasks(paths: list[str | Path]) -> list[TerminalTask]:
    """Each path is a task folder, or a folder of task folders (a dataset)."""
    out: list[TerminalTask] = []
    for p in map(Path, paths):
        if (p / "instruction.md").is_file() or (p / "task.toml").is_file():
            out.append(load_terminal_task(p))
        elif p.is_dir():
            subs = sorted(d for d in p.iterdir() if d.is_dir() and (d / "instruction.md").is_file())
            if not subs:
                raise TaskError(f"{p}: neither a task folder nor a folder of task folders")
            out += [load_terminal_task(d) for d in subs]
        else:
            raise TaskError(f"{p}: no such folder")
    ids = [t.instance_id for t in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise TaskError(f"task names repeat: {', '.join(dup)}")
    return out
