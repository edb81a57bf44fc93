"""The one progress callback type of long work: analyses, probes, distributed runs, ablation studies.

Every long function takes ``on_progress: Progress | None`` and calls it with how much is done so far (a
count in the work's own unit: segments, sentences, windows, heads, examples), the total when it is known,
and, for work done in stages, the stage's name. The command line shows it as progress bars
(:mod:`bertology.cli.progress`); a notebook may pass any function of that shape. Training reports more
than a count (the loss, the speed), as :class:`~bertology.training.settings.TrainingProgress`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Progress(Protocol):
    """Told how much of a long piece of work is done.

    done: the count done so far (cumulative, in the work's unit); total: the count it will reach, ``None``
    while unknown (e.g. until a corpus has been read); stage: the current stage's name for work done in
    stages (``""``: a single stage).
    """

    def __call__(self, done: int, total: int | None = None, *, stage: str = "") -> None: ...


def part_of(
    on_progress: Progress | None, *, offset: int = 0, total: int | None = None, stage: str = ""
) -> Progress | None:
    """``on_progress`` as a callee doing part of the work should be given it: the callee's count is
    reported as ``offset + done`` out of ``total`` (``None``: the callee's own total) under ``stage``'s name
    (``None`` stays ``None``)."""
    if on_progress is None:
        return None
    whole, name = total, stage

    def report(done: int, total: int | None = None, *, stage: str = "") -> None:
        on_progress(offset + done, total if whole is None else whole, stage=name)

    return report


@contextmanager
def stage(on_progress: Progress | None, name: str) -> Iterator[None]:
    """The block as one step of work shown as a stage of its own (loading a model, writing a report):
    0 of 1 as it starts, 1 of 1 once it is done; nothing for ``on_progress`` ``None``."""
    if on_progress is not None:
        on_progress(0, 1, stage=name)
    yield
    if on_progress is not None:
        on_progress(1, 1, stage=name)
