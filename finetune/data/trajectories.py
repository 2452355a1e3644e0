"""glm5 trajectories (agent/trajectory.py's JSONL) and `glm5 bench` run folders -> Sessions (data/sequences.py).

A trajectory is replayed record by record as `glm5 code --resume` does (messages, compactions, rewinds), and
each `model_call` becomes a Call with the prompt it was sent, its response, finish_reason and recorded ids
(`choices[0].token_ids`, `prompt_token_ids`). A call whose tool calls were denied, blocked or malformed (a
required argument missing, too), or that the tool refused as made (`failed: "call"`: an argument of the wrong
type, an edit's old_string not in the file), is kept as context but not trained unless the options say so: GLM-5
keeps erroneous segments of agent data in the sequence and masks them out of the loss, so the model learns to
correct an error without learning to make it. A command that ran and exited nonzero (a failing test run) is not
a failed call: it is trained. A line that is not JSON or a record that does not fit is skipped and reported with
its file and line.

A bench run folder (RUN/trials/<task>/<attempt>/trajectory.jsonl beside report.json) is read trial by trial,
filtered on the report's outcome: resolved only by default, or a minimum reward. A trial whose outcome is
unknown (an infrastructure error, a missing report) passes no outcome filter.

Also the per-call view align-mtp trains on (sample_sequences: (ids, prompt length) per answered call).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from agent.provenance import verified_prefix
from agent.trajectory import Trajectory
from finetune.data.jsonl import jsonl_rows
from finetune.data.report import DataReport
from finetune.data.sequences import Call, Session
from model.chat import render_for_training, render_segments

DENIED = ("denied", "blocked")  # the user refused the call / a safety rule blocked it
FORMAT_ERROR = "format_error"  # an unknown tool, arguments that do not parse, or a required one missing
FAILED = "failed"  # the tool refused the call as made (its record's `failed: "call"`); the call did run


@dataclass(frozen=True)
class DataOptions:
    """What to train on. Outcome filters: `only_resolved` None means "for bench runs only"."""

    include_denied: bool = False
    include_format_errors: bool = False
    include_failed_calls: bool = False
    only_resolved: bool | None = None
    min_reward: float | None = None
    strict: bool = False
    max_len: int = 8192
    allow_foreign: bool = False  # glm5 trajectories not recorded on this machine (agent/provenance.py) too


def trajectory_files(paths: Iterable[Path]) -> list[Path]:
    """Files as given, directories expanded to their *.jsonl files (sorted). ValueError for a path that does not
    exist or a directory without trajectories."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += files_of(p, lambda d: sorted(d.rglob("*.jsonl")), "trajectory (*.jsonl) files")
    return files


def files_of(p: Path, found: Callable[[Path], list[Path]], what: str) -> list[Path]:
    """A file as given, a directory as the files `found` in it. ValueError for a path that does not exist or a
    directory where none is found (it "holds no `what`")."""
    if p.is_dir():
        files = found(p)
        if not files:
            raise ValueError(f"{p} holds no {what}")
        return files
    if p.is_file():
        return [p]
    raise ValueError(f"{p} does not exist")


def sample_sequences(samples: Iterable[dict], tokenizer) -> list[tuple[list[int], int]]:
    """Recorded model calls -> (ids, prompt length): the prompt and the model's response, rendered with the
    chat template exactly as training renders them (`render_for_training`), cut after the response's last
    generated token. `samples` are `agent.trajectory.Trajectory.samples()` dicts (messages, tools, response)."""
    out = []
    for smp in samples:
        response = smp.get("response") or {}
        if response.get("role") != "assistant":
            continue  # a call that failed before the model answered
        msgs = list(smp["messages"]) + [response]
        r = render_for_training(tokenizer, msgs, smp.get("tools") or None)
        mine = [
            t
            for t, (i, g) in enumerate(zip(r.message_index, r.generated_mask, strict=True))
            if g and i == len(msgs) - 1
        ]
        if mine:
            out.append((r.ids[: mine[-1] + 1], mine[0]))
    return out


def recorded_sequences(files: Iterable[Path], tokenizer) -> list[tuple[list[int], int]]:
    """(ids, prompt length) of every answered model call in the trajectory files; ValueError naming a bad file."""
    seqs: list[tuple[list[int], int]] = []
    for f in files:
        try:
            seqs += sample_sequences(Trajectory.load(f).samples(), tokenizer)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{f}: {e}") from None
    return seqs


def truncated(seqs: list[tuple[list[int], int]], max_len: int) -> list[tuple[list[int], int]]:
    """Sequences longer than max_len keep their last max_len tokens (the prompt is what gets cut)."""
    return [(s[-max_len:], max(0, p - max(0, len(s) - max_len))) for s, p in seqs]


def _records(path: Path, report: DataReport) -> list[tuple[int, dict]]:
    """(line number, record) of every readable line; the rest reported (a torn last line included)."""
    out = []
    for n, rec, bad in jsonl_rows(path, errors="replace", detail=True):
        if bad is not None:
            report.skip(f"{path}:{n}", bad)
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
            report.skip(f"{path}:{n}", "not a trajectory record (no `type`)")
            continue
        out.append((n, rec))
    return out


def _step(r: dict) -> int | None:
    s = r.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


def _strictness(decision: str) -> int:
    return 3 if decision in DENIED else 2 if decision == FORMAT_ERROR else 1 if decision == FAILED else 0


def _provenance(path: Path, records: list[tuple[int, dict]], report: DataReport,
                opts: DataOptions) -> list[tuple[int, dict]]:  # fmt: skip
    """The records this machine wrote (agent/provenance.py): a file it did not write is skipped, lines appended
    to one of ours are cut; both named. `allow_foreign` (--allow-foreign) keeps them all."""
    if opts.allow_foreign:
        return records
    n = verified_prefix([r for _, r in records])
    if n == 0:
        report.skip(f"{path}:{records[0][0]}", "not recorded by glm5 on this machine (no valid provenance mark): "
                    "skipped; pass --allow-foreign to train on sessions from elsewhere")  # fmt: skip
        report.filtered["trajectories not recorded here"] += 1
    elif n < len(records):
        report.skip(f"{path}:{records[n][0]}", "this line and the ones after it were not written by glm5 on this "
                    "machine (provenance chain broken): left out; --allow-foreign keeps them")  # fmt: skip
    return records[:n]


def _valid_message(m) -> str | None:
    """Why `m` cannot be rendered, or None."""
    try:
        render_segments([m], add_generation_prompt=False)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return str(e) or type(e).__name__
    return None


def read_glm5_trajectory(path: Path, report: DataReport, opts: DataOptions) -> Session | None:
    """One trajectory file -> its Session (None if it is not a trajectory, reported)."""
    records = _records(path, report)
    if not records or records[0][1].get("type") != "session":
        report.skip(f"{path}:{records[0][0] if records else 1}", "not a glm5 trajectory: no `session` header first")
        return None
    records = _provenance(path, records, report, opts)
    if not records:
        return None
    header = records[0][1]
    # A call's decision belongs to that call: (the model call's step, the id). Ids are the model's to choose and
    # can repeat, and a later `allow` under a reused id must not turn an earlier denied call into training data;
    # two records for one key keep the strictest.
    decisions: dict[tuple, str] = {}
    for _, r in records:
        if r["type"] == "tool" and isinstance(r.get("call_id"), str):
            d = FAILED if r.get("failed") == "call" else str(r.get("decision", ""))
            key = (_step(r), r["call_id"])
            decisions[key] = max(decisions.get(key, d), d, key=_strictness)
    msgs: list[dict] = []
    bad: set[int] = set()  # id() of messages that cannot be rendered (reported once, at their line)
    calls: list[Call] = []
    for n, r in records:
        t, where = r["type"], f"{path}:{n}"
        try:
            if t == "message":
                m = r["message"]
                if (why := _valid_message(m)) is not None:
                    report.skip(where, f"bad message ({why})")
                    bad.add(id(m))
                del msgs[int(r.get("index", len(msgs))) :]
                msgs.append(m)
            elif t == "compaction":
                msgs = list(r["messages"])
            elif t == "rewind":
                del msgs[int(r["n_messages"]) :]
            elif t == "model_call":
                call = _call(r, msgs, where, decisions, bad, report, opts)
                if call is not None:
                    calls.append(call)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
            report.skip(where, f"bad `{t}` record ({type(e).__name__}: {str(e)[:120]})")
    return Session(calls, list(header.get("tools") or []), str(path))


def _call(r, msgs, where, decisions, bad, report: DataReport, opts: DataOptions) -> Call | None:
    n = int(r.get("n_messages", len(msgs)))
    response = r.get("response") or {}
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    if message.get("role") != "assistant":
        report.filtered["model calls without an answer"] += 1
        return None
    if (why := _valid_message(message)) is not None:
        report.skip(where, f"bad model response ({why})")
        return None
    prompt = list(msgs[:n])
    if any(id(m) in bad for m in prompt):
        report.filtered["model calls after a bad message (skipped)"] += 1
        return None
    trained = True
    for tc in message.get("tool_calls") or []:
        decision = decisions.get((_step(r), tc.get("id", "") if isinstance(tc, dict) else ""), "")
        if decision in DENIED and not opts.include_denied:
            trained = False
            report.filtered[f"turns with a {decision} tool call (context, not trained)"] += 1
        elif decision == FORMAT_ERROR and not opts.include_format_errors:
            trained = False
            report.filtered["turns with a malformed tool call (context, not trained)"] += 1
        elif decision == FAILED and not opts.include_failed_calls:
            trained = False
            report.filtered["turns with a failed tool call (context, not trained)"] += 1
    ids = choice.get("token_ids")
    prompt_ids = response.get("prompt_token_ids", choice.get("prompt_token_ids"))
    ok = _ids(ids) and _ids(prompt_ids)
    return Call(
        prompt,
        message,
        where,
        choice.get("finish_reason"),
        list(prompt_ids) if ok else None,
        list(ids) if ok else None,
        trained,
    )


def _ids(x) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and t >= 0 for t in x)


def is_bench_run(path: Path) -> bool:
    return path.is_dir() and (path / "trials").is_dir()


def bench_trials(run: Path, report: DataReport, opts: DataOptions) -> list[Path]:
    """The trajectories of a bench run's trials that pass the outcome filters (resolved only by default)."""
    only_resolved = True if opts.only_resolved is None else opts.only_resolved
    out = []
    for traj in sorted((run / "trials").glob("*/*/trajectory.jsonl")):
        outcome = _trial_outcome(traj.parent / "report.json", report)
        resolved, reward = outcome.get("resolved"), outcome.get("reward")
        if only_resolved and resolved is not True:
            report.filtered["trials not resolved" if resolved is False else "trials with an unknown outcome"] += 1
            continue
        if opts.min_reward is not None and not (isinstance(reward, (int, float)) and reward >= opts.min_reward):
            report.filtered[f"trials with reward below {opts.min_reward} or unknown"] += 1
            continue
        out.append(traj)
    return out


def _trial_outcome(path: Path, report: DataReport) -> dict:
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        report.skip(f"{path}:1", f"unreadable trial report ({e})")
        return {}
    grade = d.get("grade") if isinstance(d.get("grade"), dict) else d
    return {"resolved": grade.get("resolved"), "reward": grade.get("reward")}
