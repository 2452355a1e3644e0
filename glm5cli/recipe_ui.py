"""What every `glm5 finetune` command shares when it runs a finetune recipe: the rich progress of a training loop
(`TrainProgress`) and of a step loop (`step_bar`), the `ConsoleReporter` a recipe reports through, `failing()`
(a recipe's RunError / UsageError as the command's error and exit code) and the data report on stderr."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from finetune.errors import RunError, UsageError
from glm5cli.common import EXIT_ERROR, EXIT_USAGE, console, err_console, fail
from glm5cli.progress import LogSteps


@contextmanager
def failing() -> Iterator[None]:
    """A recipe's refusal (finetune/errors.py) as this command's error: its message, its hint, exit 2 for a
    usage error and 1 otherwise."""
    try:
        yield
    except RunError as e:
        fail(str(e), code=EXIT_USAGE if isinstance(e, UsageError) else EXIT_ERROR, hint=e.hint or None)


class TrainProgress:
    """Rich progress for a training loop: step, loss, tokens/s and ETA. On a terminal a live bar; otherwise
    (a log file, CI) a plain line every tenth of the run, so a log shows the run moving too. (Moved from
    glm5cli/finetune_cmd.py.)"""

    def __init__(self, description: str, steps: int, state: dict | None, quiet: bool = False):
        # rich.progress is imported here, not at the top: `glm5 --help` imports this module (speed)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.description, self.steps = description, steps
        self.done = state["step"] if state else 0
        self.tokens, self.seconds = 0, 0.0
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeRemainingColumn(),
        )
        self.live, self.quiet = err_console.is_terminal and not quiet, quiet  # quiet: a torchrun rank other than 0
        self.bar = Progress(*columns, console=err_console, transient=False) if self.live else None
        self.every = max(1, steps // 10)

    def __enter__(self) -> TrainProgress:
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task(self.description, total=self.steps, completed=self.done, loss="-", tps="-")
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.tokens / self.seconds, 1) if self.seconds > 0 else None

    def on_step(self, info) -> None:
        self.tokens += info.loss.tokens
        self.seconds += info.seconds
        loss = f"{info.loss.lm:.3f}" if not info.loss.mtp else f"{info.loss.lm:.3f} mtp {info.loss.mtp_mean:.3f}"
        tps = f"{self.tokens_per_s:,.0f}" if self.tokens_per_s else "-"
        if self.bar is not None:
            self.bar.update(self.task, completed=info.step, loss=loss, tps=tps)
        elif not self.quiet and (info.step % self.every == 0 or info.step == info.steps):
            left = (info.steps - info.step) * self.seconds / max(1, info.step - self.done)
            err_console.print(
                f"{self.description}: step {info.step}/{info.steps}  loss {loss}  {tps} tok/s  "
                f"{info.seconds:.2f} s/step  ETA {left:.0f}s"
            )


def step_bar():
    """A step bar: rich's live bar on a terminal; off one (a log file, CI) a plain line per step (LogSteps).
    (Moved from glm5cli/finetune_cmd.py's _progress.)"""
    # imported here, not at the top: `glm5 --help` imports this module (speed)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if not err_console.is_terminal:
        return LogSteps()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns, console=err_console)


class ConsoleReporter:
    """finetune.recipe.Reporter on the terminal: lines on stderr, spinners, TrainProgress, step_bar, the data
    report on stderr (unless `show_data` is False)."""

    def __init__(self, show_data: bool = True):
        self.show_data = show_data

    def say(self, line: str) -> None:
        err_console.print(line)

    def status(self, text: str):
        return console.status(text)

    def training(self, title: str, steps: int, state: dict | None, quiet: bool = False) -> TrainProgress:
        return TrainProgress(title, steps, state, quiet=quiet)

    def steps(self):
        return step_bar()

    def data(self, report: dict) -> None:
        if self.show_data:
            show_data(report)


def show_data(report: dict) -> None:
    """What the data load used, on stderr; every skipped record by file and line. (Moved from
    glm5cli/finetune_cmd.py's _show_data.)"""
    tito = report["tito_sequences"]
    err_console.print(
        f"data: {report['sequences']} sequences from {report['sessions']} sessions in {report['files']} files "
        f"({tito} from recorded token ids, {report['sequences'] - tito} rendered), {report['tokens']:,} tokens, "
        f"{report['target_tokens']:,} targets"
        + (f", {report['truncated_to_max_len']} cut to --max-len" if report["truncated_to_max_len"] else "")
    )
    for why, n in (report.get("filtered") or {}).items():
        err_console.print(f"  left out: {n} {why}")
    for line in report["skipped_records"]:
        err_console.print(f"  [yellow]skipped[/] {line}")
