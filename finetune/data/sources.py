"""Any training data the user points at -> TrainSequences and a report of what was used.

    seqs, report = load_sequences([Path(".glm5/sessions"), Path("runs/r1")], tokenizer, DataOptions())

Each path is a file or a folder; the format is told from the content, not the name alone:
- a `glm5 bench` run folder (has trials/): its trials' trajectories, outcome-filtered (data/trajectories.py)
- *.jsonl whose first record is a glm5 `session` header: a glm5 trajectory
- other *.jsonl: OpenAI chat JSONL, one {"messages", "tools"} per line (data/openai_chat.py)
- *.traj.json, or JSON with `messages` and `info`: a mini-swe-agent trajectory
- JSON with an ATIF `schema_version`: a Harbor trial trajectory (data/harbor.py)
A folder is searched for all of these. Sequences longer than max_len keep their first max_len tokens (the task
and the first turns; what is cut is counted).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from finetune.data.harbor import is_atif, read_atif
from finetune.data.jsonl import UNREAD, json_file
from finetune.data.openai_chat import read_chat_jsonl, read_mini_swe_agent
from finetune.data.report import DataReport
from finetune.data.sequences import Session, TrainSequence, branches, sequence_of
from finetune.data.trajectories import DataOptions, bench_trials, files_of, is_bench_run, read_glm5_trajectory


def data_files(paths: Iterable[Path], report: DataReport, opts: DataOptions) -> list[Path]:
    """The files under `paths`; ValueError for a path that does not exist or a folder with no data."""
    files: list[Path] = []
    for p in map(Path, paths):
        if is_bench_run(p):
            found = bench_trials(p, report, opts)
            if not found and not report.filtered:
                raise ValueError(f"{p} is a bench run without trial trajectories (trials/*/*/trajectory.jsonl)")
            files += found
        else:
            files += files_of(p, _data_in, "training data (*.jsonl, *.traj.json, ATIF trajectory.json)")
    return files


def _data_in(folder: Path) -> list[Path]:
    """The JSON and JSONL files under `folder`, sorted; a bench's reports, results and configs left out."""
    found = sorted(f for f in folder.rglob("*") if f.is_file() and f.name.endswith((".jsonl", ".json")))
    return [f for f in found if not f.name.endswith(("report.json", "result.json", "config.json"))]


def read_sessions(path: Path, report: DataReport, opts: DataOptions) -> list[Session]:
    if path.name.endswith(".jsonl"):
        first = _first_line(path)
        if first is not None and "type" in first and "messages" not in first:  # glm5's records all have a type
            s = read_glm5_trajectory(path, report, opts)
            return [s] if s is not None else []
        return read_chat_jsonl(path, report, opts)
    if path.name.endswith(".traj.json"):
        return read_mini_swe_agent(path, report, opts)
    d = json_file(path, report)
    if d is UNREAD:
        return []
    if is_atif(d):
        return read_atif(path, d, report, opts)
    if isinstance(d, dict) and "messages" in d and "info" in d:
        return read_mini_swe_agent(path, report, opts)
    report.skip(f"{path}:1", "not a format glm5 trains on (glm5, OpenAI chat, mini-swe-agent, Harbor ATIF)")
    return []


def _first_line(path: Path) -> dict | None:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    d = json.loads(line)
                except (ValueError, RecursionError):
                    return None
                return d if isinstance(d, dict) else None
    return None


def load_sequences(paths: Iterable[Path], tokenizer, opts: DataOptions) -> tuple[list[TrainSequence], DataReport]:
    """Every sequence with at least one target, and the report. BadRecord (with strict) for the first bad one."""
    report = DataReport(strict=opts.strict)
    seqs: list[TrainSequence] = []
    for f in data_files(paths, report, opts):
        report.files += 1
        for session in read_sessions(f, report, opts):
            report.sessions += 1
            for branch in branches(session):
                try:
                    seq = sequence_of(branch, session.tools, tokenizer, branch[-1].where)
                except (ValueError, KeyError, TypeError) as e:
                    report.skip(branch[-1].where, f"cannot render the conversation ({e})")
                    continue
                first = next((i for i, m in enumerate(seq.mask) if i and m), None)  # the first target token
                if len(seq.ids) > opts.max_len:
                    seq = TrainSequence(seq.ids[: opts.max_len], seq.mask[: opts.max_len], seq.source, seq.tito)
                    report.truncated += 1
                if first is not None and first >= opts.max_len:  # the prompt before any model turn fills max_len
                    report.filtered["sequences whose prompt before the first model turn fills --max-len"] += 1
                    report.prefix_past_max_len = min(report.prefix_past_max_len or first, first)
                    continue
                if not any(seq.mask[1:]):  # the first token is never a target (nothing predicts it)
                    report.filtered["sequences with nothing to train"] += 1
                    continue
                seqs.append(seq)
                report.sequences += 1
                report.tito += seq.tito
                report.tokens += len(seq.ids)
                report.targets += seq.targets
    return seqs, report
