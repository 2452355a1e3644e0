"""What a task file may hold, checked by pydantic: a SWE-bench row (SWERow) and a Harbor task.toml's tables
(HarborToml). Each model reports its first problem in field order, and `problem` words it as glm5 always has:
the field named (`instance_id ...`, `[agent].timeout_sec ...`); tasks.py adds the file and the line.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from agent.bench import harness_specs
from agent.bench.log_parsers import parser_for

SWE_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")


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


def good_id(ident: str) -> bool:
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
        if not good_id(v):  # the id becomes a folder name under the run; no slashes, no dot-dot games
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


def problem(e: ValidationError) -> str:
    """The first problem pydantic found, in the words glm5 has always used: the field named."""
    err = e.errors(include_url=False)[0]
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    field = ".".join(map(str, err["loc"]))
    return f"{field} must be a string" if err["type"] == "string_type" else f"{field}: {err['msg']}"


# -- Harbor task.toml ------------------------------------------------------------------------------------------


def _positive(v: Any, where: str, kind: type = float) -> Any:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise ValueError(f"{where} must be a positive number, not {v!r}")
    return kind(v)


class _Table(BaseModel):
    model_config = ConfigDict(extra="allow")


class _TaskTable(_Table):
    name: Any = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: Any) -> Any:
        if v and not isinstance(v, str):
            raise ValueError("[task].name must be a string")
        return v


class _AgentTable(_Table):
    timeout_sec: Any = None

    @field_validator("timeout_sec")
    @classmethod
    def _timeout(cls, v: Any) -> float | None:
        return _positive(v, "[agent].timeout_sec")


class _VerifierTable(_Table):
    timeout_sec: Any = None
    env: Any = None

    @field_validator("timeout_sec")
    @classmethod
    def _timeout(cls, v: Any) -> float | None:
        return _positive(v, "[verifier].timeout_sec")

    @field_validator("env")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        v = v or {}
        if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
            raise ValueError("[verifier].env must be a table of strings")
        return dict(v)


class _EnvironmentTable(_Table):
    memory_mb: Any = None
    cpus: Any = None
    allow_internet: Any = False
    network_mode: Any = None
    docker_image: Any = None
    workdir: Any = None

    @field_validator("memory_mb", "cpus")
    @classmethod
    def _count(cls, v: Any, info: ValidationInfo) -> int | None:
        return _positive(v, f"[environment].{info.field_name}", int)

    @field_validator("allow_internet")
    @classmethod
    def _internet(cls, v: Any) -> bool:
        if not isinstance(v, bool):  # "false" is a true string: the network would be on
            raise ValueError(f"[environment].allow_internet must be true or false, not {v!r}")
        return v

    @field_validator("docker_image")
    @classmethod
    def _image(cls, v: Any) -> str | None:
        if v is not None and (not isinstance(v, str) or not good_image(v)):
            raise ValueError(f"[environment].docker_image {str(v)[:80]!r} is not a Docker image reference")
        return v


class HarborToml(BaseModel):
    """The tables of a Harbor task.toml that glm5 reads, checked by pydantic (an absent or empty table is {}); the
    first problem is reported, named as `[table].key`. Other keys are allowed and kept in TerminalTask.config."""

    model_config = ConfigDict(extra="allow")

    task: _TaskTable = _TaskTable()
    agent: _AgentTable = _AgentTable()
    verifier: _VerifierTable = _VerifierTable()
    environment: _EnvironmentTable = _EnvironmentTable()

    @field_validator("task", "agent", "verifier", "environment", mode="before")
    @classmethod
    def _a_table(cls, v: Any, info: ValidationInfo) -> Any:
        v = v or {}
        if not isinstance(v, dict):
            raise ValueError(f"[{info.field_name}] must be a table")
        return v
