"""Progress on stderr for long work: counts (of one stage or several) and training steps.

On a terminal they are Rich's bars, redrawn in place and gone when the work ends. Elsewhere (stderr
written to a log or a pipe, where Rich draws nothing) they are plain lines: one when a stage starts, one
each tenth of a known total (or each :data:`LINE_SECONDS` while the total is unknown) and one when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bertology.cli.app import err
from bertology.progress import Progress
from bertology.training.settings import TrainingProgress

#: Seconds between two progress lines of work whose total is not known (stderr not a terminal).
LINE_SECONDS = 30.0
#: Progress lines per stage of a known total (one per tenth), besides the first.
LINE_STEPS = 10


class ProgressLines:
    """Progress as lines on stderr, for a stderr that is not a terminal (module docstring). Called as a
    :class:`~bertology.progress.Progress`; ``what`` names the single stage (``stage=""``); ``rate``: also
    say the speed, in ``rate`` per second."""

    def __init__(self, what: str, rate: str | None = None) -> None:
        self.what, self.rate = what, rate
        self.started: dict[str, float] = {}
        self.shown: dict[str, tuple[int, float]] = {}  # per stage: the last step shown, and when

    def _line(self, name: str, done: int, total: int | None, detail: str) -> str:
        seconds = time.perf_counter() - self.started[name]
        count = f"{done:,}" if total is None else f"{done:,}/{total:,} ({done / max(total, 1):.0%})"
        speed = f", {done / seconds:,.1f} {self.rate}/s" if self.rate and seconds > 0 and done else ""
        return f"{name}: {count}, {seconds:.0f} s{speed}{f', {detail}' if detail else ''}"

    def report(self, done: int, total: int | None = None, *, stage: str = "", detail: str = "") -> None:
        """As a call, with ``detail`` (e.g. the training loss) added to the line when one is shown."""
        name = stage or self.what
        now = time.perf_counter()
        if name not in self.started:
            self.started[name] = now
            self.shown[name] = (0, now)
            err.print(f"{name}...", highlight=False)
        step, last = self.shown[name]
        if total:
            reached = min(LINE_STEPS, done * LINE_STEPS // total)
            if reached > step:
                self.shown[name] = (reached, now)
                err.print(self._line(name, done, total, detail), highlight=False)
        elif now - last >= LINE_SECONDS:
            self.shown[name] = (step, now)
            err.print(self._line(name, done, total, detail), highlight=False)

    def __call__(self, done: int, total: int | None = None, *, stage: str = "") -> None:
        self.report(done, total, stage=stage)


@contextmanager
def progress_bar(what: str, total: int | None, *, rate: str | None = None) -> Iterator[Progress]:
    """Progress on stderr for long work: a bar for ``what`` (``total``: its count when known beforehand)
    and one more for each stage the work names; yields the :class:`~bertology.progress.Progress` that
    moves them. rate: also show the speed, in ``rate`` per second. Lines where stderr is no terminal
    (:class:`ProgressLines`)."""
    if not err.is_terminal:
        lines = ProgressLines(what, rate)
        if what:
            lines(0, total)
        yield lines
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        ProgressColumn,
        Task,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as Bars
    from rich.text import Text

    class Speed(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text("" if task.speed is None else f"{task.speed:,.1f} {rate}/s")

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Bars(*columns, *([Speed()] if rate else []), console=err, transient=True) as bars:
        expected = total
        tasks: dict[str, TaskID] = {}

        def update(done: int, total: int | None = None, *, stage: str = "") -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage or what, total=expected if not stage else total)
            bars.update(tasks[stage], completed=done, total=total)

        if what:
            update(0)
        yield update


@contextmanager
def training_progress(total: int) -> Iterator[Callable[[TrainingProgress], None]]:
    """A progress bar on stderr showing the optimizer step and the running training loss (lines where
    stderr is no terminal, :class:`ProgressLines`)."""
    if not err.is_terminal:
        lines = ProgressLines("Fine-tuning", rate="steps")
        lines(0, total)
        yield lambda state: lines.report(state.step, state.total, detail=f"loss {state.loss:.3f}")
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("Fine-tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("train", total=total, loss="–")

        def show(state: TrainingProgress) -> None:
            progress.update(task, total=state.total, completed=state.step, loss=f"{state.loss:.3f}")

        yield show
