"""Progress bars on stderr for long work: counts (of one stage or several) and training steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bertology.cli.app import err
from bertology.progress import Progress
from bertology.training.settings import TrainingProgress


@contextmanager
def progress_bar(what: str, total: int | None, *, rate: str | None = None) -> Iterator[Progress]:
    """Progress bars on stderr for long work: one for ``what`` (``total``: its count when known beforehand)
    and one more for each stage the work names; yields the :class:`~bertology.progress.Progress` that
    moves them. rate: also show the speed, in ``rate`` per second."""
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
    """A progress bar on stderr showing the optimizer step and the running training loss."""
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
