"""Progress bars on stderr for long work: counts, training steps and the stages of a study.
"""


from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bertology.cli.app import err
from bertology.training.settings import TrainingProgress


@contextmanager
def progress_bar(what: str, total: int | None, *, rate: str | None = None) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr for long work; yields the callback that reports how many are done (and,
    as a second argument, the total once it is known). rate: also show the speed, in ``rate`` per second."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class Speed(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text("" if task.speed is None else f"{task.speed:,.1f} {rate}/s")

    columns = [TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, *([Speed()] if rate else []), console=err, transient=True) as progress:
        task = progress.add_task(what, total=total)
        yield lambda done, total=None: progress.update(task, completed=done, total=total)


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


@contextmanager
def stage_progress() -> Iterator[Callable[[str, int, int], None]]:
    """Progress bars on stderr, one per stage of a long run; yields ``update(stage, done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        stages: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in stages:
                stages[stage] = progress.add_task(stage, total=total)
            progress.update(stages[stage], completed=done)

        yield update
