"""Every reader of outside data, fed random and adversarial lines (issue 40): a clear error (a ValueError of the
reader's kind, named by file and line where there are lines) or a skipped line; never another exception, a
hang, or memory beyond the input's size.

Readers: glm5 trajectories, OpenAI chat JSONL, mini-swe-agent and Harbor ATIF trajectories (finetune's
sources), bench run folders (results.jsonl -> report), SWE-bench task files and Harbor task.toml, reward specs,
RL prompt rows, checkpoint configs and adapter configs.
"""

from __future__ import annotations

import json
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ADVERSARIAL = [
    "[" * 200_000 + "]" * 200_000,  # nesting past the recursion limit
    '{"a":' * 50_000 + "1" + "}" * 50_000,
    "1" * 100_000,  # an integer past Python's digit limit
    "-1e999999",
    "NaN",
    '{"type": "session", "id": ' + "9" * 5000 + "}",
    "null",
    "[]",
    '"text"',
    "{",
    "\x00\x01\x02",
    '{"type": 5}',
    '{"type": "message", "index": -99999999999, "message": {"role": "assistant", "content": [1, {"x": null}]}}',
    '{"type": "model_call", "step": "x", "n_messages": 1e308, "response": {"choices": "no"}}',
    '{"type": "tool", "call_id": [], "decision": {}}',
    '{"type": "rewind", "n_messages": "all"}',
    '{"type": "compaction", "messages": 7}',
    '{"messages": [{"role": 1}], "tools": "x"}',
    '{"messages": "no", "info": []}',
    '{"instance_id": "../../etc", "repo": 1, "base_commit": null, "FAIL_TO_PASS": "[[["}',
    '{"instance_id": "a", "attempt": 1e400, "status": "resolved"}',
    '{"prompt": {"a": 1}, "reward": {"type": "regex", "pattern": "(((((((((("}}',
    "\ud800" if False else "\udcff",  # a lone surrogate (as text)
]

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "messages", "message", "role", "content", "tool_calls", "index", "step", "id",
                         "call_id", "decision", "response", "choices", "instance_id", "attempt", "status", "reward",
                         "prompt", "schema_version", "steps", "info", "tools", "function", "arguments"]) | st.text(
            max_size=8), inner, max_size=6),  # fmt: skip
    max_leaves=20,
)


@contextmanager
def deadline(seconds: int = 20):
    """A reader that hangs fails the test instead of the suite."""

    def _raise(*_):
        raise TimeoutError("the reader hung")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _lines_file(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
    return path


def _readers(tmp: Path):
    """(name, a callable reading `path` with one reader) for each reader of lines."""
    from agent.bench.reports import build_report, junit_xml, markdown
    from agent.bench.run_folder import read_results
    from agent.bench.tasks import load_swe_tasks
    from finetune.data.sources import load_sequences
    from finetune.data.trajectories import DataOptions
    from model.tokenizer import Tokenizer

    tok = Tokenizer.shipped()

    def glm5_trajectory(path):
        head = json.dumps({"type": "session", "id": "s", "schema": "glm5-trajectory/1", "tools": []})
        p = path.with_name("t.jsonl")
        p.write_text(head + "\n" + path.read_text(encoding="utf-8", errors="surrogateescape"), errors="surrogateescape")
        return load_sequences([p], tok, DataOptions(allow_foreign=True))

    def chat(path):
        return load_sequences([path.rename(path.with_name("chat.jsonl"))], tok, DataOptions(allow_foreign=True))

    def mini(path):
        return load_sequences([path.rename(path.with_name("x.traj.json"))], tok, DataOptions(allow_foreign=True))

    def atif(path):
        """A Harbor trial's trajectory.json whose steps are the lines (or one line as the steps themselves)."""
        steps = []
        for line in path.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
            try:
                steps.append(json.loads(line))
            except (ValueError, RecursionError):
                steps.append(line)
        p = path.with_name("trajectory.json")
        p.write_text(json.dumps({"schema_version": "ATIF-v1.2", "steps": steps[0] if len(steps) == 1 else steps}))
        return load_sequences([p], tok, DataOptions(allow_foreign=True))

    def json_file(path):
        return load_sequences([path.rename(path.with_name("trial.json"))], tok, DataOptions(allow_foreign=True))

    def run_folder(path):
        run = path.parent / "run"
        run.mkdir(exist_ok=True)
        (run / "config.json").write_text(json.dumps({"kind": "swe", "k": 1, "task_ids": ["a"], "shard": "1/1"}))
        path.rename(run / "results.jsonl")
        read_results(run / "results.jsonl")
        report = build_report([run])
        return junit_xml(report), markdown(report)

    def prompts(path):
        from finetune.data.prompts import read_prompt_rows

        return read_prompt_rows(path, tok)

    return {"glm5_trajectory": glm5_trajectory, "chat_jsonl": chat, "mini_swe_agent": mini, "run_folder": run_folder,
            "swe_tasks": load_swe_tasks, "prompt_rows": prompts, "atif": atif, "json_file": json_file}  # fmt: skip


def _clear_errors():
    from agent.bench.run_folder import RunFolderError
    from agent.bench.tasks import TaskError
    from finetune.data.report import BadRecord

    return (ValueError, TaskError, RunFolderError, BadRecord)


READERS = ["glm5_trajectory", "chat_jsonl", "mini_swe_agent", "atif", "json_file", "run_folder", "swe_tasks",
           "prompt_rows"]


def _check(reader: str, tmp: Path, lines: list[str]) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    path = _lines_file(tmp / "in.jsonl", lines)
    with deadline():
        try:
            _readers(tmp)[reader](path)
        except _clear_errors() as e:
            assert str(e).strip(), f"{reader}: an error without a message"
            assert not isinstance(e, RecursionError)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("line", range(len(ADVERSARIAL)))
def test_an_adversarial_line_is_a_clear_error_or_skipped(reader, line, tmp_path):
    _check(reader, tmp_path, [ADVERSARIAL[line]])


@pytest.mark.parametrize("reader", READERS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(JSON_VALUES, min_size=1, max_size=4))
def test_random_json_lines_are_a_clear_error_or_skipped(reader, values, tmp_path_factory):
    lines = [json.dumps(v) for v in values]
    _check(reader, tmp_path_factory.mktemp(reader), lines)


@pytest.mark.parametrize("line", range(len(ADVERSARIAL)))
def test_reward_specs_task_tomls_checkpoint_and_adapter_configs(line, tmp_path):
    from agent.bench.tasks import load_terminal_task
    from finetune.rl.rewards import data_spec_problem, parse_reward_spec
    from model.config import GLM5Config

    text = ADVERSARIAL[line]
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = text
    with deadline():
        for call in (lambda: parse_reward_spec(value), lambda: data_spec_problem(value, None)):
            try:
                call()
            except _clear_errors():
                pass
        (tmp_path / "config.json").write_text(text, errors="surrogateescape")
        try:
            GLM5Config.from_pretrained(tmp_path)
        except _clear_errors():
            pass
        t = tmp_path / "task"
        (t / "tests").mkdir(parents=True, exist_ok=True)
        (t / "tests" / "test.sh").write_text("true\n")
        (t / "instruction.md").write_text("x\n")
        (t / "task.toml").write_text(f"[environment]\nmemory_mb = {json.dumps(text)}\n[task]\nname = {json.dumps(text)}\n",
                                     errors="surrogateescape")  # fmt: skip
        try:
            load_terminal_task(t)
        except _clear_errors():
            pass


@pytest.mark.parametrize("line", range(len(ADVERSARIAL)))
def test_adapter_configs(line, tmp_path, tiny_model):
    from finetune.lora import load_adapter

    (tmp_path / "adapter_config.json").write_text(ADVERSARIAL[line], errors="surrogateescape")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with deadline():
        try:
            load_adapter(tiny_model, tmp_path)
        except _clear_errors():
            pass


@pytest.fixture(scope="module")
def tiny_model():
    from model import GLM5ForCausalLM
    from model.config import preset

    return GLM5ForCausalLM(preset("tiny"))
