"""What every probe returns: one score per attention head, the best head, and the files of a run.

:class:`ProbeResult` is the one shape of a finished probe run (the four kinds are in
:mod:`bertology.probes.results`; the verbs of :mod:`bertology.probes.run` return them): its
``[layers, heads]`` grid of scores for a key (a relation, a mention type, a gender, a parser column), the
best head of that grid (:class:`BestHead`), its tables, the summary a report shows above them and
:meth:`ProbeResult.save`, which writes its data files (CSV, JSON). The HTML report of a run, with its
plots, is written by :func:`bertology.report.probes.write_probe_report`, which saves the result and adds
them: the report layer draws on the probes, never the other way round (the import layers of
``pyproject.toml``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from bertology.summaries import Summarised

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class BestHead:
    """The best head of a probe: ``layer`` and ``head`` (0-based), its ``score`` (the probe's measure:
    accuracy, F1 or UAS; NaN when nothing was scored) and, for the probes that read attention in two
    directions (dependency relations, the parser), the ``direction`` (an index into
    :data:`bertology.probes.dependency.DIRECTIONS`; None elsewhere)."""

    layer: int
    head: int
    score: float
    direction: int | None = None

    @property
    def label(self) -> str:
        """``"layer-head"``, 0-based."""
        return f"{self.layer}-{self.head}"

    @classmethod
    def of_grid(cls, grid: np.ndarray, direction: int | None = None) -> BestHead:
        """The highest non-NaN cell of a ``[layers, heads]`` grid (ties: the first in layer, head order);
        ``(0, 0, NaN)`` when every cell is NaN."""
        if np.isnan(grid).all():
            return cls(0, 0, float("nan"), direction)
        layer, head = np.unravel_index(np.nanargmax(grid), grid.shape)
        return cls(int(layer), int(head), float(grid[layer, head]), direction)


class ProbeResult(Summarised, ABC):
    """A finished probe run: every head's score, the best head, tables, a summary and its data files.

    Class attributes: ``kind`` ("dependency", "parser", "coreference" or "gap"); ``measure`` (what a
    score is: "accuracy", "F1" or "UAS"); ``title`` (the report's title, before the model's name);
    ``explanation`` (the report's paragraph saying what is measured); ``table_file`` (:meth:`table` as
    CSV), ``frame_file`` (:meth:`to_frame` as CSV) and ``json_file`` (:meth:`to_json`, or None when the
    probe writes no JSON), the files :meth:`save` writes.
    """

    kind: ClassVar[str]
    measure: ClassVar[str]
    title: ClassVar[str]
    explanation: ClassVar[str]
    table_file: ClassVar[str]
    frame_file: ClassVar[str]
    json_file: ClassVar[str | None] = None

    model_name: str

    @abstractmethod
    def grid(self, key: str | None = None) -> np.ndarray:
        """[layers, heads] float64: every head's score for ``key`` (None: the probe's overall key).

        Raises:
            BertologyError: a key the probe does not have.
        """

    def best(self, key: str | None = None) -> BestHead:
        """The head with the highest score in :meth:`grid` (ties: the first in layer, head order)."""
        return BestHead.of_grid(self.grid(key))

    @abstractmethod
    def table(self) -> pd.DataFrame:
        """The probe's headline table (written as :attr:`table_file`)."""

    @abstractmethod
    def to_frame(self) -> pd.DataFrame:
        """Every head's scores in long form, one row per key and head (written as :attr:`frame_file`)."""

    @abstractmethod
    def to_json(self) -> str:
        """The run's counts or scores as JSON text."""

    @abstractmethod
    def summary(self) -> dict[str, str | int | float]:
        """What the report's header shows: the model, the files read, counts and seconds."""

    @property
    def files(self) -> list[str]:
        """The names of the files :meth:`save` writes."""
        return [self.table_file, self.frame_file, *([self.json_file] if self.json_file else [])]

    def save(self, folder: str | Path) -> list[Path]:
        """Write the data files (:attr:`files`) into ``folder`` (created if missing); return their paths."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        self.table().to_csv(target / self.table_file, index=False)
        self.to_frame().to_csv(target / self.frame_file, index=False)
        if self.json_file:
            (target / self.json_file).write_text(self.to_json(), encoding="utf-8")
        return [target / name for name in self.files]
