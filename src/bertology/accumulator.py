"""The one streaming contract of bertology: corpus statistics, probe tallies and a distributed run's
partial results are all accumulators.

An accumulator is fed its batches by ``update(...)`` (each kind takes a batch of what it measures: an
attention batch, segments, numbered sentences, a scored window), folds in another accumulator of the same
kind and settings with :meth:`~Accumulator.merge` (a later shard of the same run, e.g. from a worker) and
gives what it measured with :meth:`~Accumulator.result`. Its state depends on the model, never on the
corpus, and merging the accumulators of consecutive parts of a run, in order, gives the result of one pass
over all of it; :attr:`~Accumulator.items` counts what it has folded in, the count a distributed run
reports progress and keeps checkpoints by (:mod:`bertology.cluster.driver`).
"""

from __future__ import annotations

from typing import Any, Protocol, Self, TypeVar

ResultT = TypeVar("ResultT", covariant=True)


class Accumulator(Protocol[ResultT]):
    """A mergeable streaming measurement (see the module docstring)."""

    @property
    def items(self) -> int:
        """How many items it has folded in, in its batches' unit (segments, sentences, windows, heads)."""

    def update(self, *batch: Any) -> object:
        """Fold one batch into the running state."""

    def merge(self, other: Self) -> Self:
        """Fold ``other``'s state into this one (``other`` is left as it was) and return ``self``."""

    def result(self) -> ResultT:
        """What it measured over everything folded in so far."""
