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
Every error names the file, and the line or the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from agent.bench import harness_specs
from agent.bench.log_parsers import parser_for

SWE_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")
HARBOR_SCHEMAS = ("1.0", "1.1", "1.2", "1.3", "1.4")


class TaskError(ValueError):
    """A task file or folder is wrong; the message names the file and the line or field."""


@dataclass(frozen=True)
class SWETask:
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
    def task_id(self) -> str:
        return self.instance_id

    @property
    def text(self) -> str:
        """What the agent is told: the issue, and nothing of the tests or the fix."""
        return self.problem_statement


@dataclass(frozen=True)
class TerminalTask:
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
    def task_id(self) -> str:
        return self.instance_id

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


def _test_list(value: Any, name: str) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is a string but not a JSON list ({e})") from None
    if hasattr(value, "tolist"):  # a numpy array from parquet
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{name} must be a list of test names (or a JSON string of one)")
    return tuple(value)


MAX_ID = 200  # a folder name: most filesystems allow 255 bytes


def _good_id(ident: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9_.\-]+", ident)) and len(ident) <= MAX_ID and ident.strip(".") != ""


_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")


def good_image(ref: str) -> bool:
    """A Docker image reference (registry/name:tag or @digest); never one that `docker run` would read as a flag."""
    return bool(_IMAGE.fullmatch(ref))


class SWERow(BaseModel):
    """What glm5 reads of a SWE-bench row, checked by pydantic: the four required fields, strings where strings
    belong, the test lists, and the harness's fields; any other key is kept (SWETask.extra). The first problem in
    field order is reported, named by its field."""

    model_config = ConfigDict(extra="allow", strict=True)

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str | None = None
    test_patch: str | None = None
    test_cmd: str | None = None
    log_parser: str | None = None
    setup: str | None = None
    version: str | None = None
    environment_setup_commit: str | None = None
    hints_text: str | None = None
    eval_script: str | None = None
    image: str | None = None
    eval_type: str | None = None
    python: str | None = None
    dockerfile: str | None = None
    FAIL_TO_PASS: Any = ()
    PASS_TO_PASS: Any = ()

    @model_validator(mode="before")
    @classmethod
    def _required(cls, row: Any) -> Any:
        if not isinstance(row, dict):
            raise ValueError(f"a task must be a JSON object, not {type(row).__name__}")
        missing = [k for k in SWE_REQUIRED if not row.get(k)]
        if missing:
            raise ValueError(f"missing required field(s) {', '.join(missing)}")
        return row

    @field_validator("instance_id")
    @classmethod
    def _folder_name(cls, v: str) -> str:
        if not _good_id(v):  # the id becomes a folder name under the run; no slashes, no dot-dot games
            raise ValueError(f"instance_id {v[:80]!r} may hold only letters, digits, . _ - (not only dots), at most "
                             f"{MAX_ID} of them")  # fmt: skip
        return v

    @field_validator("log_parser")
    @classmethod
    def _known_parser(cls, name: str | None) -> str | None:
        """glm5's (or a plugin's) parser, or one the installed harness has (parse_log_*)."""
        if name and harness_specs.is_harness_parser(name):
            if name not in harness_specs.parser_names():  # HarnessMissing says to install the extra
                raise ValueError(f"log_parser {name!r} is not one the installed swebench harness has")
        elif name:
            parser_for(name, "")
        return name

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v and not good_image(v):
            raise ValueError(f"image {v[:80]!r} is not a Docker image reference")
        return v

    @field_validator("eval_type")
    @classmethod
    def _eval_type(cls, v: str | None) -> str | None:
        if v and v not in ("pass_and_fail", "fail_only"):
            raise ValueError(f"eval_type must be pass_and_fail or fail_only, not {v[:40]!r}")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        if v and not re.fullmatch(r"3\.\d{1,2}", v):
            raise ValueError(f"python must be a version such as 3.9, not {v[:40]!r}")
        return v

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _tests(cls, v: Any, info: ValidationInfo) -> tuple[str, ...]:
        return _test_list(v, info.field_name)


def _problem(e: ValidationError) -> str:
    """The first problem pydantic found, in the words glm5 has always used: the field named."""
    err = e.errors(include_url=False)[0]
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    field = ".".join(map(str, err["loc"]))
    return f"{field} must be a string" if err["type"] == "string_type" else f"{field}: {err['msg']}"


def swe_task_from_row(row: Any, where: str) -> SWETask:
    """One SWE-bench row (a dict) -> SWETask; `where` is `file:line` for errors."""
    try:
        r = SWERow.model_validate(row)
    except ValidationError as e:
        raise TaskError(f"{where}: {_problem(e)}") from None
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


def _table(data: dict[str, Any], key: str, where: Path) -> dict[str, Any]:
    v = data.get(key) or {}
    if not isinstance(v, dict):
        raise TaskError(f"{where}: [{key}] must be a table")
    return v


def _num(table: dict[str, Any], key: str, where: str, kind: type = float) -> Any:
    v = table.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise TaskError(f"{where}.{key} must be a positive number, not {v!r}")
    return kind(v)


def load_terminal_task(folder: str | Path) -> TerminalTask:
    """A Harbor task folder -> TerminalTask. Needs instruction.md and tests/test.sh; task.toml is optional."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise TaskError(f"{folder}: not a task folder")
    toml_path = folder / "task.toml"
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
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        raise TaskError(f"{folder}: instruction.md is missing (what the agent is asked to do)")
    if not (folder / "tests" / "test.sh").is_file():
        raise TaskError(f"{folder}: tests/test.sh is missing (the verifier)")
    task = _table(data, "task", toml_path)
    agent, verifier = _table(data, "agent", toml_path), _table(data, "verifier", toml_path)
    env = _table(data, "environment", toml_path)
    name = task.get("name") or folder.name
    if not isinstance(name, str):
        raise TaskError(f"{toml_path}: [task].name must be a string")
    ident = re.sub(r"[^A-Za-z0-9_.\-]", "__", name)
    if not _good_id(ident):
        raise TaskError(f"{toml_path}: [task].name {name[:80]!r} cannot name a folder (only dots, or over {MAX_ID})")
    venv = verifier.get("env") or {}
    if not isinstance(venv, dict) or not all(isinstance(v, str) for v in venv.values()):
        raise TaskError(f"{toml_path}: [verifier].env must be a table of strings")
    network = env.get("network_mode")
    internet = env.get("allow_internet", False)
    if not isinstance(internet, bool):  # "false" is a true string: the network would be on
        raise TaskError(f"{toml_path}: [environment].allow_internet must be true or false, not {internet!r}")
    allow = internet or network == "public"
    image = env.get("docker_image")
    if image is not None and (not isinstance(image, str) or not good_image(image)):
        raise TaskError(f"{toml_path}: [environment].docker_image {str(image)[:80]!r} is not a Docker image reference")
    return TerminalTask(
        instance_id=ident,
        path=folder,
        instruction=instruction.read_text(encoding="utf-8"),
        config=data,
        agent_timeout_s=_num(agent, "timeout_sec", f"{toml_path}: [agent]"),
        verifier_timeout_s=_num(verifier, "timeout_sec", f"{toml_path}: [verifier]") or 600.0,
        verifier_env=dict(venv),
        docker_image=env.get("docker_image"),
        memory_mb=_num(env, "memory_mb", f"{toml_path}: [environment]", int),
        cpus=_num(env, "cpus", f"{toml_path}: [environment]", int),
        allow_internet=allow,
        workdir=str(env.get("workdir") or "/app"),
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
