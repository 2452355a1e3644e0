"""What every fine-tuning recipe shares with whoever runs it (the CLI, a test, a script): the run folder a
recipe trains in, and the `Reporter` it tells what it does.

    run = Run(out, settings, reporter=rep)        # finetune/run_dir.py's RunDir; resuming says so
    state = run.start(data)
    with rep.training("fine-tuning (LoRA)", steps, state) as bar:
        hist = train_sft(model, seqs, cfg, **run.loop_args(state, save_every, bar))
    run.finish()

A recipe never prints: lines, spinners and progress bars go through the Reporter (glm5cli's draws them with
rich; `Quiet` here draws nothing). Errors are finetune.errors' RunError / UsageError.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

from finetune.dist_checkpoint import load_resume, save_dcp
from finetune.errors import RunError
from finetune.run_dir import RunDir


def tail_mean(xs: list[float], n: int = 10) -> float:
    """The mean of the last `n` values: a run's summary "last" loss, steadier than its very last step's."""
    return sum(xs[-n:]) / len(xs[-n:])


class StepProgress(Protocol):
    """A training loop's progress: `on_step(StepInfo)` after every step, the tokens/s it measured."""

    tokens_per_s: float | None

    def on_step(self, info) -> None: ...


class Reporter(Protocol):
    def say(self, line: str) -> None:
        """A line for the user (the CLI: on stderr)."""

    def status(self, text: str) -> AbstractContextManager:
        """Shown while something long runs without steps (loading a checkpoint, writing INT4)."""

    def training(self, title: str, steps: int, state: dict | None, quiet: bool = False) -> AbstractContextManager:
        """-> a StepProgress for a training loop of `steps` steps, resumed at `state`'s step."""

    def steps(self) -> AbstractContextManager:
        """-> a step bar with rich Progress's add_task(description, total, completed) / update(task, ...)."""

    def data(self, report: dict) -> None:
        """What the data load used (finetune/data/report.py's report as a dict)."""


class _NoSteps:
    tokens_per_s = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def on_step(self, info) -> None:
        pass

    def add_task(self, description: str, total: int, completed: int = 0) -> int:
        return 0

    def update(self, task: int, **kw) -> None:
        pass


class Quiet:
    """A Reporter that shows nothing (tests, library use)."""

    def say(self, line: str) -> None:
        pass

    def status(self, text: str) -> AbstractContextManager:
        return nullcontext()

    def training(self, title: str, steps: int, state: dict | None, quiet: bool = False) -> AbstractContextManager:
        return _NoSteps()

    def steps(self) -> AbstractContextManager:
        return _NoSteps()

    def data(self, report: dict) -> None:
        pass


class Run:
    """finetune.run_dir.RunDir for a recipe: a resumed run says so through the reporter; a DCP checkpoint that
    cannot be resumed is a RunError. (Moved from glm5cli/finetune_cmd.py's _Run.)"""

    def __init__(self, out: Path, settings: dict, added: dict | None = None, reporter: Reporter | None = None):
        self.dir = RunDir(out, settings, added)
        self.out, self.settings, self.work = out, settings, self.dir.work
        self.reporter = reporter or Quiet()

    def saved_sequences(self) -> dict | None:
        return self.dir.saved_sequences()

    def start(self, data: dict, check=None) -> dict | None:
        """Write the settings and the data -> the last checkpoint to resume from (None: a new run), checked by
        `check(state, path)` (the training loop's shape by default)."""
        state = self.dir.start(data, check=check)
        if state is not None:
            self.reporter.say(f"resuming {self.work} from step {state['step']} of {self.settings['steps']}")
        return state

    def open(self, data: dict) -> None:
        """Write the settings and the data and resume nothing: for a recipe that keeps its own training state
        (agentic RL's, finetune/rl/run.py)."""
        self.dir.start(data, load=False)

    def start_resumable(self, data: dict, named, dist) -> dict | None:
        """`start` for a run whose last checkpoint may be a torchrun run's (DCP) or a single process's
        (state.pt), resumed at this run's world size (finetune/dist_checkpoint.py); only rank 0 writes."""
        if dist is None or dist.is_main:
            self.dir.start(data, load=False)
        if dist is not None:
            dist.barrier()
        try:
            state = load_resume(self.work, named, dist)
        except ValueError as e:
            raise RunError(str(e), f"delete {self.work} to start over") from None
        if state is not None and (dist is None or dist.is_main):
            self.reporter.say(f"resuming {self.work} from step {state['step']} of {self.settings['steps']}")
        return state

    def save(self, state: dict) -> None:
        self.dir.save(state)

    def loop_args(self, state: dict | None, save_every: int, bar: StepProgress, named=None, dist=None) -> dict:
        """The training loop's arguments: resume from `state`, checkpoint here, report each step to `bar`.
        Under torchrun (`dist`) the checkpoints are DCP's, of the sharded `named`."""
        save = self.save
        if dist is not None:
            save = lambda st: save_dcp(self.work, st, named, dist)  # noqa: E731
        return {"resume": state, "save": save, "save_every": save_every, "on_step": bar.on_step}

    def finish(self) -> None:
        self.dir.finish()
