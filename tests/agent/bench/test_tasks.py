"""Task loading: SWE-bench rows in every published shape, Harbor folders, and errors that name file and line."""

from __future__ import annotations

import json

import pytest

from agent.bench.tasks import TaskError, load_swe_tasks, load_terminal_task, load_terminal_tasks

ROW = {
    "instance_id": "acme__calc-1",
    "repo": "acme/calc",
    "base_commit": "abc123",
    "problem_statement": "add() subtracts",
    "patch": "diff --git a/calc.py b/calc.py\n",
    "test_patch": "",
    "FAIL_TO_PASS": json.dumps(["test_calc.py::test_add"]),
    "PASS_TO_PASS": ["test_calc.py::test_sub"],
    "version": "1.0",
    "environment_setup_commit": "abc123",
    "created_at": "2024-01-01",
}


def test_jsonl_with_json_string_and_list_test_lists(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(ROW) + "\n\n" + json.dumps({**ROW, "instance_id": "acme__calc-2"}) + "\n")
    tasks = load_swe_tasks(p)
    assert [t.instance_id for t in tasks] == ["acme__calc-1", "acme__calc-2"]
    assert tasks[0].FAIL_TO_PASS == ("test_calc.py::test_add",)
    assert tasks[0].PASS_TO_PASS == ("test_calc.py::test_sub",)
    assert tasks[0].extra == {"created_at": "2024-01-01"}
    assert tasks[0].source == f"{p}:1" and tasks[1].source == f"{p}:3"
    assert "test" not in tasks[0].text.lower()  # the agent sees the issue only


def test_malformed_line_is_named_by_file_and_line(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(ROW) + "\n" + '{"instance_id": "x", "repo": \n')
    with pytest.raises(TaskError, match=rf"{p}:2: not valid JSON"):
        load_swe_tasks(p)


def test_missing_field_and_bad_test_list_named(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps({**ROW, "base_commit": ""}) + "\n")
    with pytest.raises(TaskError, match=rf"{p}:1: missing required field\(s\) base_commit"):
        load_swe_tasks(p)
    p.write_text(json.dumps({**ROW, "FAIL_TO_PASS": "[not json"}) + "\n")
    with pytest.raises(TaskError, match=rf"{p}:1: FAIL_TO_PASS is a string but not a JSON list"):
        load_swe_tasks(p)
    for bad in ("../escape", "..", ".", "x" * 300):  # a folder name under the run: no dot-dot, not too long
        p.write_text(json.dumps({**ROW, "instance_id": bad}) + "\n")
        with pytest.raises(TaskError, match="may hold only"):
            load_swe_tasks(p)


@pytest.mark.parametrize(
    "field, value, words",
    [("test_cmd", 5, "test_cmd must be a string"), ("setup", ["a"], "setup must be a string"),
     ("log_parser", "nosuch", "unknown log_parser 'nosuch'"), ("version", {"v": 1}, "version must be a string"),
     ("hints_text", 3, "hints_text must be a string")],
)  # fmt: skip
def test_a_field_of_the_wrong_type_is_named_at_load_not_a_crash_per_trial(tmp_path, field, value, words):
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps({**ROW, field: value}) + "\n")
    with pytest.raises(TaskError, match=rf"{p}:1: {words}"):
        load_swe_tasks(p)


def test_a_file_that_is_not_utf8_or_nested_too_deep_is_named(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_bytes(json.dumps(ROW).encode() + b"\n" + b'{"instance_id": "\xff"}\n')
    with pytest.raises(TaskError, match=rf"{p}:2: not UTF-8 text"):
        load_swe_tasks(p)
    p.write_text("[" * 100_000)
    with pytest.raises(TaskError, match="nested too deep"):
        load_swe_tasks(p)


def test_duplicate_ids_refused(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n")
    with pytest.raises(TaskError, match=rf"{p}:2: instance_id 'acme__calc-1' repeats {p}:1"):
        load_swe_tasks(p)


def test_json_list_and_parquet(tmp_path):
    j = tmp_path / "tasks.json"
    j.write_text(json.dumps([ROW]))
    assert load_swe_tasks(j)[0].FAIL_TO_PASS == ("test_calc.py::test_add",)
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    q = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist([ROW, {**ROW, "instance_id": "acme__calc-3"}]), q)
    tasks = load_swe_tasks(q)
    assert [t.instance_id for t in tasks] == ["acme__calc-1", "acme__calc-3"]
    assert tasks[1].PASS_TO_PASS == ("test_calc.py::test_sub",)


def _harbor(folder, toml: str | None = None):
    folder.mkdir(parents=True)
    (folder / "instruction.md").write_text("Create /app/hello.txt containing hello.\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    if toml is not None:
        (folder / "task.toml").write_text(toml)
    return folder


def test_harbor_task_schema_1_4(tmp_path):
    f = _harbor(
        tmp_path / "hello",
        'schema_version = "1.4"\n[task]\nname = "glm5/hello"\n[agent]\ntimeout_sec = 120\n'
        '[verifier]\ntimeout_sec = 30\nenv = { MODE = "strict" }\n[environment]\nmemory_mb = 512\n',
    )
    t = load_terminal_task(f)
    assert t.instance_id == "glm5__hello" and t.agent_timeout_s == 120 and t.verifier_timeout_s == 30
    assert t.verifier_env == {"MODE": "strict"} and t.memory_mb == 512 and not t.allow_internet
    assert t.text.startswith("Create /app/hello.txt")


def test_harbor_errors_name_the_file(tmp_path):
    f = _harbor(tmp_path / "bad", '[agent]\ntimeout_sec = "soon"\n')
    with pytest.raises(TaskError, match=r"task.toml: \[agent\].timeout_sec must be a positive number"):
        load_terminal_task(f)
    g = _harbor(tmp_path / "old", 'schema_version = "9.0"\n')
    with pytest.raises(TaskError, match="schema_version '9.0'"):
        load_terminal_task(g)
    h = tmp_path / "empty"
    h.mkdir()
    (h / "instruction.md").write_text("x")
    with pytest.raises(TaskError, match="tests/test.sh is missing"):
        load_terminal_task(h)


def test_allow_internet_must_be_a_boolean(tmp_path):
    # "false" is a true string: the network was on for a task that asked for it off
    f = _harbor(tmp_path / "net", 'schema_version = "1.4"\n[environment]\nallow_internet = "false"\n')
    with pytest.raises(TaskError, match=r"allow_internet must be true or false"):
        load_terminal_task(f)
    g = _harbor(tmp_path / "net2", 'schema_version = "1.4"\n[environment]\nallow_internet = false\n')
    assert load_terminal_task(g).allow_internet is False


def test_folder_of_task_folders(tmp_path):
    _harbor(tmp_path / "ds" / "b")
    _harbor(tmp_path / "ds" / "a")
    assert [t.instance_id for t in load_terminal_tasks([tmp_path / "ds"])] == ["a", "b"]
