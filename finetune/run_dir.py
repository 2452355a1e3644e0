"""A resumable training run's folder: every finetune command writes OUT this way.

The run works in `.OUT.partial` beside OUT: `run.json` (the settings), `sequences.json` (the data, exactly as
it was trained on), `state.pt` (the last checkpoint of the training loop; under torchrun `dcp-STEP/`,
finetune/dist_checkpoint.py) and `train_log.jsonl` (one line per step), and renames that folder into place
when it is done, so OUT is complete or absent. Rerunning the same command after a kill resumes from the last checkpoint; other settings are refused rather than mixed into the
interrupted run. Every file is written aside and renamed (a kill mid-write leaves the previous one).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from finetune.artifacts import save_atomic, write_atomic
from finetune.errors import RunError

MARK = "provenance.mark"  # this machine's keyed mark of MARKED (agent/provenance.py)
MARKED = ("run.json", "sequences.json")


class RunDir:
    FILES = ("run.json", "sequences.json", "state.pt", MARK)

    def __init__(self, out: Path, settings: dict, added: dict | None = None):
        """`added`: settings (dotted paths into `settings`, e.g. "config.negative_weight") that a run folder written
        before they existed lacks, with the value that behaviour had then: such a folder resumes when the new
        settings keep those values."""
        out = Path(out)
        if out.exists():
            raise RunError(
                f"{out} already exists", "choose a new --out directory; the input checkpoint is never changed"
            )
        self.out, self.settings = out, settings
        self.work = out.with_name(f".{out.name}.partial")
        self.resuming = (self.work / "run.json").is_file()
        if self.resuming:
            self._check_mark()
            saved = _with_added(json.loads((self.work / "run.json").read_text()), added or {})
            if saved != _jsonable(settings):
                differ = ", ".join(_differences(saved, _jsonable(settings))[:6])
                raise RunError(
                    f"{self.work} holds an interrupted run with other settings ({differ})",
                    "rerun it with the same options to resume it, or delete that directory",
                )

    def _marked_bytes(self) -> bytes:
        parts = [(self.work / n).read_bytes() if (self.work / n).is_file() else b"" for n in MARKED]
        return b"\0".join(parts)

    def _check_mark(self) -> None:
        """A folder this machine did not start (planted where --out points, copied from elsewhere) is not
        resumed: its settings and data would be trained on as if the user had chosen them."""
        from agent.provenance import has_mark

        mark_file = self.work / MARK
        try:
            ok = mark_file.is_file() and has_mark(self._marked_bytes(), mark_file.read_text()[:200])
        except OSError:
            ok = False
        if not ok:
            raise RunError(f"{self.work} holds a run this machine did not start (no valid provenance mark on its "
                           "settings and data)", f"delete {self.work} to start over")  # fmt: skip

    def saved_sequences(self) -> dict | None:
        """The data an interrupted run trained on (so a resumed run does not read or generate it again)."""
        path = self.work / "sequences.json"
        return json.loads(path.read_text()) if self.resuming and path.is_file() else None

    def start(self, data: dict, load: bool = True, check=None) -> dict | None:
        """From here on the run can be resumed: its settings and data are written. -> the last checkpoint
        (state.pt; None with `load=False`, for a caller that reads DCP checkpoints too: dist_checkpoint.py),
        checked by `check(state, path)` (the training loop's shape by default)."""
        self.work.mkdir(parents=True, exist_ok=True)
        write_atomic(self.work / "run.json", json.dumps(self.settings, indent=1))
        write_atomic(self.work / "sequences.json", json.dumps(data))
        from agent.provenance import mark

        write_atomic(self.work / MARK, mark(self._marked_bytes()))
        state_path = self.work / "state.pt"
        if not load:
            return None
        if not (self.resuming and state_path.is_file()):
            return None
        from finetune.resume_state import StateError, check_training_state, load_state

        try:  # the folder may not be this user's doing: nothing in it runs, and its shape is checked
            return (check or check_training_state)(load_state(state_path), state_path)
        except StateError as e:
            raise RunError(str(e), f"delete {self.work} to start over") from None

    def save(self, state: dict) -> None:
        """A checkpoint, written aside and renamed: a kill mid-write leaves the previous one. A torchrun run's
        older DCP checkpoints (dcp-STEP/, when this run resumed one) go: this one is newer."""
        save_atomic(self.work / "state.pt", state)
        for old in self.work.glob("dcp-*"):
            shutil.rmtree(old, ignore_errors=True)

    def finish(self) -> None:
        """Drop the resume files and move the finished folder to OUT."""
        for name in self.FILES:
            (self.work / name).unlink(missing_ok=True)
        for old in self.work.glob("dcp-*"):
            shutil.rmtree(old, ignore_errors=True)
        os.replace(self.work, self.out)


def _jsonable(obj):
    return json.loads(json.dumps(obj))


def _with_added(saved: dict, added: dict) -> dict:
    """`saved` with each `added` dotted path it lacks set to its value (run folders from before the setting)."""
    out = json.loads(json.dumps(saved))
    for path, value in added.items():
        *parents, key = path.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and key not in node:
            node[key] = _jsonable(value)
    return out


def _differences(a, b, prefix: str = "") -> list[str]:
    """Dotted paths where two settings dicts differ, with both values: what a refused resume changed."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _differences(a.get(k, "(absent)"), b.get(k, "(absent)"), f"{prefix}{k}.")]  # fmt: skip
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} then, {b!r} now"]
