"""Shards: the units of work of a distributed corpus run.

A shard is a run of consecutive batches, in exactly the order and composition a local run gives them
(:func:`bertology.analysis.analyze.corpus_batches`: windows of segments sorted longest first, then batches),
with the number of its first segment in that order. A worker that folds a shard's batches into accumulators
started at that number computes what the local run computes for those segments, so merging the shards'
accumulators gives the local result (up to the order of floating-point sums, about 1e-16 relative).
The items of a batch are corpus segments for ``analyze`` and ``compare``, numbered sentences or documents
for the probes (:mod:`bertology.cluster.probes`); "segment" below means whichever item.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from bertology.errors import BertologyError

#: Segments per shard by default: 8 batches of 32, a few seconds of work for a small model on one core,
#: so the work spreads evenly over the workers and the per-shard overhead stays small.
SHARD_SEGMENTS = 256


#: What a batch holds (a segment, a sentence, a document).
ItemT = TypeVar("ItemT")


@dataclass(frozen=True)
class Shard(Generic[ItemT]):
    """Consecutive batches of a corpus run.

    number: the shard's place in the run (0-based). first_segment: the number of its first segment in the
    run's order. batches: its batches of segments, as the local run forms them.
    """

    number: int
    first_segment: int
    batches: tuple[list[ItemT], ...]

    @property
    def segments(self) -> int:
        """How many segments the shard holds."""
        return sum(len(batch) for batch in self.batches)

    @property
    def end_segment(self) -> int:
        """The number of the first segment after the shard."""
        return self.first_segment + self.segments

    def describe(self) -> str:
        """``"shard 3 (segments 768-1023)"``, for messages."""
        return f"shard {self.number} (segments {self.first_segment}-{self.end_segment - 1})"


def shards_of(
    batches: Iterable[list[ItemT]], segments_per_shard: int = SHARD_SEGMENTS
) -> Iterator[Shard[ItemT]]:
    """Group a run's batches, in order, into shards of whole batches with at least ``segments_per_shard``
    segments each (the last shard may have fewer).

    Raises:
        BertologyError: ``segments_per_shard`` below 1.
    """
    if segments_per_shard < 1:
        raise BertologyError(f"A shard needs at least 1 segment, not {segments_per_shard}.")
    number = first = count = 0
    group: list[list[ItemT]] = []
    for batch in batches:
        group.append(batch)
        count += len(batch)
        if count >= segments_per_shard:
            yield Shard(number, first, tuple(group))
            number, first, count, group = number + 1, first + count, 0, []
    if group:
        yield Shard(number, first, tuple(group))
