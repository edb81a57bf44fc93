"""The streaming accumulator contract and the running sums the accumulators are built from.

Every corpus statistic is an :class:`~bertology.accumulator.Accumulator`: ``update(batch)`` folds in one
:class:`~bertology.attention.capturing.AttentionBatch`, ``merge(other)`` folds in another accumulator of the
same kind (e.g. from another worker), ``result()`` gives the statistic and ``items`` counts the segments seen.
State is a few float64 arrays whose size depends on the model (layers x heads), never on the corpus, and
merging the accumulators of two halves of a corpus gives the result of one pass over all of it.

Vocabulary: a *segment* is one input of a batch (one text or one text pair, as in Clark et al. 2019);
its *sentences* are text A and text B (``segment_ids`` 0 and 1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.models.devices import float64_home

if TYPE_CHECKING:
    import pandas as pd


def head_index_frame(num_layers: int, num_heads: int) -> dict[str, np.ndarray]:
    """``layer`` and ``head`` columns (0-based) for one row per head, layer-major."""
    layer, head = np.divmod(np.arange(num_layers * num_heads), num_heads)
    return {"layer": layer, "head": head}


def json_ready(values: np.ndarray) -> list[Any]:
    """Nested lists of a float array with NaN as ``None`` (strict JSON has no NaN)."""
    return np.where(np.isnan(values), None, values).tolist()


@dataclass
class HeadTable:
    """Named per-head values, each ``[layers, heads]`` float64, over a corpus of segments.

    columns: statistic name -> ``[layers, heads]`` value (NaN where no segment defined it).
    defined_segments: statistic name -> number of segments that contributed to it.
    segments: number of segments seen.
    """

    columns: dict[str, np.ndarray]
    defined_segments: dict[str, int]
    segments: int

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    @property
    def num_layers(self) -> int:
        return next(iter(self.columns.values())).shape[0]

    @property
    def num_heads(self) -> int:
        return next(iter(self.columns.values())).shape[1]

    def to_frame(self) -> pd.DataFrame:
        """One row per head, ``layer`` and ``head`` 0-based, then one column per statistic."""
        import pandas as pd

        flat = {name: values.reshape(-1) for name, values in self.columns.items()}
        return pd.DataFrame({**head_index_frame(self.num_layers, self.num_heads), **flat})

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.num_layers,
            "heads": self.num_heads,
            "segments": self.segments,
            "defined_segments": self.defined_segments,
            "columns": {name: json_ready(values) for name, values in self.columns.items()},
        }

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict`; each column is a ``[layers][heads]`` list, NaN as ``null``."""
        return json.dumps(self.to_dict(), allow_nan=False)


def on_the_host(state: dict[str, Any]) -> dict[str, Any]:
    """An accumulator's ``__dict__`` with its tensors moved to the CPU: what it pickles to, so that a
    checkpoint or another process need not have the device its sums were kept on."""
    return {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in state.items()}


def check_same_shape(expected: tuple[int, int] | None, found: tuple[int, int], what: str) -> None:
    if expected is not None and expected != found:
        raise BertologyError(
            f"{what} is for {expected[0]} layers x {expected[1]} heads but got {found[0]} x {found[1]}; "
            "an accumulator takes one model's attention only."
        )


class SegmentMeans:
    """Running per-head means over segments, one per named statistic.

    Each update gives every segment a value per statistic and head and says whether the statistic is
    defined for that segment (e.g. [SEP]-to-[SEP] needs a [SEP] query). The mean of statistic ``s`` is
    ``sums[s] / counts[s]``: the plain average over the segments where ``s`` is defined.

    The sums stay where the values are computed, in float64 (:func:`~bertology.models.devices.float64_home`:
    on the CPU for MPS, which has no float64), and reach the host only in :meth:`table` or when pickled, not
    once per batch.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.sums: torch.Tensor | None = None  # [statistics, layers, heads] float64
        self.counts: torch.Tensor | None = None  # [statistics] int64
        self.segments = 0

    @property
    def shape(self) -> tuple[int, int] | None:
        """(layers, heads), or ``None`` before the first update."""
        return None if self.sums is None else (self.sums.shape[1], self.sums.shape[2])

    def add(self, values: torch.Tensor, defined: torch.Tensor) -> None:
        """values: [segments, statistics, layers, heads]; defined: [segments, statistics] bool."""
        check_same_shape(self.shape, (values.shape[2], values.shape[3]), "This accumulator")
        home = float64_home(values.device)
        kept = torch.where(defined[:, :, None, None], values.to(home, torch.float64), 0.0).sum(0)
        self._fold(kept, defined.to(home).sum(0))
        self.segments += values.shape[0]

    def _fold(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """Adds ``sums`` [statistics, layers, heads] and ``counts`` [statistics] to the running ones."""
        if self.sums is None or self.counts is None:
            self.sums, self.counts = sums.clone(), counts.clone()
        else:
            self.sums += sums.to(self.sums.device)
            self.counts += counts.to(self.counts.device)

    def merge(self, other: SegmentMeans) -> None:
        if other.names != self.names:
            raise BertologyError("Cannot merge accumulators of different statistics.")
        if other.sums is None or other.counts is None:
            return
        check_same_shape(self.shape, other.shape, "This accumulator")
        self._fold(other.sums, other.counts)
        self.segments += other.segments

    def __getstate__(self) -> dict[str, Any]:
        return on_the_host(self.__dict__)

    def table(self, what: str) -> HeadTable:
        """The means as a :class:`HeadTable`; ``what`` names the accumulator in the error."""
        if self.sums is None or self.counts is None:
            raise BertologyError(f"The {what} has seen no segments yet; update it with a batch first.")
        sums, counts = self.sums.cpu().numpy(), self.counts.cpu().numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums / counts[:, None, None]
        means[counts == 0] = np.nan
        return HeadTable(
            columns=dict(zip(self.names, means, strict=True)),
            defined_segments={name: int(count) for name, count in zip(self.names, counts, strict=True)},
            segments=self.segments,
        )


class SegmentCounter:
    """Gives each segment of a stream its index: ``first`` + the number of segments seen before it.

    Accumulators that remember *which* segment something happened in, or that sample per segment, use
    this index. When a corpus is split into shards, give each shard's accumulator ``first`` = the
    shard's first segment index; then merged shards agree with one pass.
    """

    def __init__(self, first: int = 0) -> None:
        self.next = first

    def take(self, count: int) -> np.ndarray:
        """[count] int64 indices of the next ``count`` segments."""
        indices = np.arange(self.next, self.next + count, dtype=np.int64)
        self.next += count
        return indices

    def merge(self, other: SegmentCounter) -> None:
        self.next = max(self.next, other.next)
