"""SWE-bench-format and Harbor tasks as slime prompt data: one JSONL row per task, read by slime's Dataset with
`--input-key prompt --label-key label --metadata-key metadata`. The prompt is the task's text (for slime's logs
and filters; glm5's agent builds its own prompt); the metadata names the task so that the rollout module
(generate.py) can load it again: its kind (swe / terminal), where it came from, and its id."""

from __future__ import annotations

import json
from pathlib import Path

from finetune.rl.bench_env import load_bench_tasks

TASK_KEY = "glm5_task"  # the metadata entry generate.py reads


def prompt_rows(env: str, tasks_file: Path | None, task_dirs: list[Path]) -> list[dict]:
    """The bench's tasks (finetune.rl.bench_env.load_bench_tasks: the same parsing and checks) as slime rows."""
    tasks = load_bench_tasks(env, tasks_file, task_dirs)
    rows = []
    for t in tasks:
        if env == "swe":
            source, text = str(Path(tasks_file).resolve()), t.problem_statement
        else:
            source, text = str(Path(t.path).resolve()), t.instruction
        meta = {TASK_KEY: {"env": env, "source": source, "id": t.instance_id}}
        rows.append({"prompt": text, "label": t.instance_id, "metadata": meta})
    return rows


def write_prompt_data(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def load_task(ref: dict, _cache: dict = {}):  # noqa: B006 - a per-process cache of parsed task files
    """The task a row's metadata names (tasks.py wrote it), parsed by the bench's loaders; an unknown id is an
    error naming it."""
    env, source, task_id = ref["env"], ref["source"], ref["id"]
    key = (env, source)
    if key not in _cache:
        _cache[key] = {t.instance_id: t for t in load_bench_tasks(env, Path(source) if env == "swe" else None,
                                                                   [Path(source)] if env != "swe" else [])}  # fmt: skip
    if task_id not in _cache[key]:
        raise KeyError(f"task {task_id!r} is not in {source}")
    return _cache[key][task_id]
