"""The rollout buffer: finished rollouts by group, GLM-5's rules applied when the trainer takes a batch.

`add(rollout)` writes it to DIR/g{group}-s{index}.json (whole, then renamed: a kill leaves it or nothing) and
files it under its group. `take(version, n)` returns the n lowest-numbered complete groups that survive the
rules, and why the others were dropped:

- staleness: a sample whose oldest model call was sampled with weights more than tau versions behind the
  trainer's (`version - oldest > tau`) is dropped (GLM-5 §4.1.2, w' - w0 > tau);
- crash groups: environment failures (and dropped stale samples) leave a group's valid samples; with more
  than half of the group valid it is padded to its size by repeating valid samples in order, otherwise the
  whole group is dropped (GLM-5's environment-failure filtering). A session whose reward's checker could not
  run (UNSCORED, the completion env's) is no crash: it stays in its group, which leaves it out of the advantages;
- no signal (DAPO's dynamic sampling, `take(..., filter_uniform=K)`): a group whose rewards are all equal has no
  GRPO advantage and would only dilute the step; up to K of them per step are dropped ("no_signal") so that
  the orchestrator runs other groups in their place; past K a step takes what it has (a policy that solves
  every task, or none, must not stall the run).

`forget(groups)` deletes consumed groups' files once the trainer's checkpoint that consumed them is written;
a resumed run reloads the rest with `load()`, so finished rollouts are never regenerated, and their
staleness is judged again against the resumed trainer's version.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from finetune.rl.rollout import Rollout


@dataclass
class TakeReport:
    kept: list[int] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)  # group -> why
    padded: int = 0  # samples added by padding
    stale_samples: int = 0
    crashed_samples: int = 0
    lags: Counter = field(default_factory=Counter)  # version lag of the kept samples
    uniform: list[Rollout] = field(default_factory=list)  # the sessions of the groups dropped for no signal

    def dropped_by_reason(self) -> dict[str, int]:
        return dict(Counter(r.split(":")[0] for r in self.dropped.values()))


def apply_rules(group: list[Rollout], version: int, tau: int, size: int) -> tuple[list[Rollout] | None, str, dict]:
    """GLM-5's rules on one complete group -> (the group to train, or None if dropped; why; counts)."""
    stale = [r for r in group if r.oldest_version is not None and version - r.oldest_version > tau]
    valid = [r for r in group if r.in_group and r not in stale]  # unscored ones stay: their group leaves them out
    crashed = sum(1 for r in group if not r.in_group)
    counts = {"stale": len(stale), "crashed": crashed}
    if len(valid) == size:
        return valid, "", counts
    if 2 * len(valid) > size:
        return valid + [valid[k % len(valid)] for k in range(size - len(valid))], "", counts
    why = "stale" if len(stale) >= crashed else "crashed"
    return None, f"{why}: {len(valid)}/{size} valid ({len(stale)} stale, {crashed} crashed)", counts


class RolloutBuffer:
    def __init__(self, folder: Path | None, group_size: int, tau: int):
        self.folder = Path(folder) if folder is not None else None
        self.size, self.tau = group_size, tau
        self.groups: dict[int, dict[int, Rollout]] = {}
        self.changed = threading.Condition()
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def add(self, r: Rollout) -> None:
        if self.folder is not None:
            path = self.folder / f"g{r.group}-s{r.index}.json"
            tmp = path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                json.dump(r.to_json(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        with self.changed:
            self.groups.setdefault(r.group, {})[r.index] = r
            self.changed.notify_all()

    def load(self, consumed: set[int]) -> int:
        """Rollouts a killed run had finished (consumed groups' files deleted) -> how many were loaded."""
        n = 0
        for path in sorted(self.folder.glob("g*-s*.json")) if self.folder else []:
            r = Rollout.from_json(json.loads(path.read_text()))
            if r.group in consumed:
                path.unlink()
                continue
            self.groups.setdefault(r.group, {})[r.index] = r
            n += 1
        return n

    def has(self, group: int, index: int) -> bool:
        with self.changed:
            return index in self.groups.get(group, {})

    def complete(self) -> list[int]:
        with self.changed:
            return sorted(g for g, rs in self.groups.items() if len(rs) == self.size)

    def take(self, version: int, n: int, wait=None, filter_uniform: int = 0) -> tuple[list[list[Rollout]], TakeReport]:
        """The next `n` groups that survive the rules. `wait()` is called while fewer are complete (it must
        make progress: run more sessions, or sleep on `changed`); dropped groups leave the buffer.
        `filter_uniform`: drop up to this many groups whose rewards are all equal (no signal) in this take."""
        rep = TakeReport()
        uniform = 0
        batch: list[list[Rollout]] = []
        while len(batch) < n:
            ready = [g for g in self.complete() if g not in rep.kept]
            if not ready:
                if wait is None:
                    raise RuntimeError(f"the buffer holds {len(batch)} of the {n} groups a step needs")
                wait(rep)
                continue
            g = ready[0]
            with self.changed:
                group = [self.groups[g][i] for i in sorted(self.groups[g])]
            kept, why, counts = apply_rules(group, version, self.tau, self.size)
            rep.stale_samples += counts["stale"]
            rep.crashed_samples += counts["crashed"]
            if kept is not None and uniform < filter_uniform and len({r.reward for r in kept}) == 1:
                rep.uniform += {id(r): r for r in kept}.values()
                kept, why = None, f"no_signal: all {len(kept)} rewards {kept[0].reward:g}"
                uniform += 1
            if kept is None:
                rep.dropped[g] = why
                self.forget([g])
                continue
            rep.kept.append(g)
            rep.padded += self.size - len({id(r) for r in kept})
            distinct = {id(r): r for r in kept}.values()
            rep.lags.update(version - r.oldest_version for r in distinct if r.oldest_version is not None)
            batch.append(kept)
        return batch, rep

    def forget(self, groups) -> None:
        with self.changed:
            for g in groups:
                self.groups.pop(g, None)
                if self.folder is not None:
                    for i in range(self.size):
                        (self.folder / f"g{g}-s{i}.json").unlink(missing_ok=True)
            self.changed.notify_all()
