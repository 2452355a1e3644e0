"""glm5 trajectories (agent/trajectory.py's JSONL) -> training sequences: token ids and which tokens are targets.

Knows the trajectory format and the chat format (model/chat.py); knows nothing of models or training.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def trajectory_files(paths: Iterable[Path]) -> list[Path]:
    """Files as given, directories expanded to their *.jsonl files (sorted). ValueError for a path that does not
    exist or a directory without trajectories."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.rglob("*.jsonl"))
            if not found:
                raise ValueError(f"{p} holds no trajectory (*.jsonl) files")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise ValueError(f"{p} does not exist")
    return files


def sample_sequences(samples: Iterable[dict], tokenizer) -> list[tuple[list[int], int]]:
    """Recorded model calls -> (ids, prompt length): the prompt and the model's response, rendered with the
    chat template exactly as training renders them (`render_for_training`), cut after the response's last
    generated token. `samples` are `agent.trajectory.Trajectory.samples()` dicts (messages, tools, response)."""
    from model.chat import render_for_training

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
    from agent.trajectory import Trajectory

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
