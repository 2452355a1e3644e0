"""Progress on stderr: rich's live bar on a terminal; off one (a log file, a pipe, CI) a plain line per finished
unit, since a bar draws nothing there until it ends.

- BenchProgress  `glm5 bench swe|terminal`: done / total, resolved, infra errors, cost; a line per trial in a log,
                 and a line when a run resumes
- LogSteps       rich Progress's add_task / update for a log: a line per step (`glm5 finetune rl`, align-mtp's
                 generation)
"""

from __future__ import annotations

import time

from glm5cli.common import err_console


class BenchProgress:
    """Progress on stderr: done / total, resolved so far, infra errors, cost, ETA. On a terminal a live bar;
    otherwise (a log file, CI) one plain line per finished trial, so a log shows the run moving."""

    def __init__(self, kind: str):
        self.kind = kind
        self.resolved = self.infra = self.done = self.total = 0
        self.cost = 0.0

    def __enter__(self):
        self.p = None  # started by the first event, so an error before the run shows no empty bar
        self.live, self.t0 = err_console.is_terminal, time.monotonic()
        return self

    def __exit__(self, *exc):
        if self.p is not None:
            self.p.__exit__(*exc)

    def _start(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TextColumn("ETA"),
                          TimeRemainingColumn(), console=err_console, transient=False)  # fmt: skip
        self.p.__enter__()
        self.task = self.p.add_task(f"bench {self.kind}", total=None, status="")

    def event(self, kind: str, data) -> None:
        if kind == "start":
            self.resolved, self.done, self.total = data["resolved"], data["done"], data["total"]
            if data["done"]:
                err_console.print(f"resuming: {data['done']} of {data['total']} trials already finished "
                                  f"({data['resolved']} resolved)", highlight=False)  # fmt: skip
        elif kind == "trial":
            r = data["result"]
            self.infra += 1 if r.status == "infra_error" else 0
            self.resolved += 1 if r.resolved else 0
            self.done += 1 if data["final"] else 0
            self.cost += r.cost_usd
        if not self.live:
            if kind == "trial":
                self._line(data["result"], data["final"])
            return
        if self.p is None:
            self._start()
        if kind == "start":
            self.p.update(self.task, total=data["total"], completed=data["done"], status=self._status())
        elif kind == "trial":
            if data["final"]:
                self.p.advance(self.task)
            self.p.update(self.task, status=self._status())

    def _line(self, r, final: bool) -> None:
        """One line for a log: which trial ended how, the run's count so far and its time."""
        what = r.status if final else f"{r.status}, retrying (try {r.try_})"
        err_console.print(f"bench {self.kind}: {self.done}/{self.total} {r.instance_id} {what} in {r.seconds:.0f}s  "
                          f"{self._status()}  {time.monotonic() - self.t0:.0f}s elapsed", highlight=False)  # fmt: skip

    def _status(self) -> str:
        return f"resolved {self.resolved}  infra {self.infra}  ${self.cost:.4f}"


class LogSteps:
    """rich Progress's add_task / update, written as one line per step for a log: a bar off a terminal draws
    nothing until it ends (and then a blank line)."""

    def __enter__(self) -> LogSteps:
        self.t0, self.tasks = time.monotonic(), []
        return self

    def __exit__(self, *exc) -> None:
        pass

    def add_task(self, description: str, total: int, completed: int = 0) -> int:
        self.tasks.append({"description": description, "total": total, "completed": completed, "first": completed})
        return len(self.tasks) - 1

    def update(self, task: int, advance: int = 0, description: str | None = None, completed: int | None = None):
        t = self.tasks[task]
        t["description"] = description or t["description"]
        t["completed"] = (t["completed"] if completed is None else completed) + advance
        seconds, ran = time.monotonic() - self.t0, t["completed"] - t["first"]
        eta = f", about {(t['total'] - t['completed']) * seconds / ran:.0f}s left" if ran > 0 else ""
        err_console.print(f"{t['description']}: {t['completed']}/{t['total']} ({seconds:.0f}s{eta})",
                          highlight=False, markup=False)  # fmt: skip
