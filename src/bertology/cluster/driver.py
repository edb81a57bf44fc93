"""The driver's side of a distributed run: hand the shards to the workers, merge what they return in
shard order, keep a checkpoint, report progress.

Every distributed command (``analyze``, ``compare``, ``probe deps``/``coref``, ``ablate``) runs through
:func:`run_on_shards` (its batches cut into shards, identified for its checkpoint, timed) and
:func:`merge_shards` with its own accumulators; what differs is only the job its workers start, the
batches it reads and the accumulators it merges.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from bertology.accumulator import Accumulator
from bertology.cluster.checkpoint import CHECKPOINT_SECONDS, Checkpointer, corpus_identity
from bertology.cluster.shards import ItemT, Shard, shards_of
from bertology.cluster.workers import WorkerPool
from bertology.errors import BertologyError
from bertology.progress import Progress


@dataclass(frozen=True)
class ShardedRun:
    """How a distributed run keeps its work and reports on it (every distributed command takes one).

    checkpoint: a file where the merged accumulators are kept every ``checkpoint_seconds``, at the end and
    when the driver is interrupted (:mod:`bertology.cluster.checkpoint`; ``None``: no checkpoint);
    resume: start from it (when it exists) instead of from the first shard; on_progress: called after
    each merged shard with the items merged so far and the run's total (``None`` until the corpus has been
    read).
    """

    checkpoint: Path | None = None
    resume: bool = False
    checkpoint_seconds: float = CHECKPOINT_SECONDS
    on_progress: Progress | None = None


#: A run with no checkpoint and no progress reports (the default of every distributed run).
PLAIN_RUN = ShardedRun()


#: The accumulators a run merges (:class:`~bertology.accumulator.Accumulator`).
AccumulatorT = TypeVar("AccumulatorT", bound=Accumulator[Any])


def run_identity(kind: str, job: object, corpus: str | Path, **options: object) -> dict[str, Any]:
    """What a checkpoint of a run must match: its kind, its job's fields (a dataclass), the corpus file
    (:func:`~bertology.cluster.checkpoint.corpus_identity`) and the driver's options."""
    fields = asdict(job) if is_dataclass(job) and not isinstance(job, type) else {"job": repr(job)}
    return {"kind": kind, **fields, **corpus_identity(corpus), **options}


class _CountedShards:
    """The run's shards from number ``skip`` on, counting every segment read (skipped ones included), so
    the total is known once the corpus has been read."""

    def __init__(self, shards: Iterable[Shard], skip: int, skipped_segments: int) -> None:
        self.shards, self.skip, self.skipped_segments = iter(shards), skip, skipped_segments
        self.segments = 0
        self.exhausted = False

    def __iter__(self) -> Iterator[Shard]:
        for shard in self.shards:
            self.segments += shard.segments
            if shard.number == self.skip and shard.first_segment != self.skipped_segments:
                raise BertologyError(
                    f"The checkpoint holds {self.skipped_segments} segments but its shards end at segment "
                    f"{shard.first_segment} of the corpus; run without --resume to start again."
                )
            if shard.number >= self.skip:
                yield shard
        self.exhausted = True

    def total(self, limit: int | None) -> int | None:
        return self.segments if self.exhausted else limit


def merge_shards(
    pool: WorkerPool[Any],
    shards: Iterable[Shard],
    merged: AccumulatorT,
    *,
    run: dict[str, Any],
    limit: int | None = None,
    sharded: ShardedRun = PLAIN_RUN,
) -> AccumulatorT:
    """Run ``shards`` on the pool's workers and merge their results into ``merged`` (empty accumulators
    that hold the driver's models), in shard order; returns ``merged``.

    run: what identifies the run (:func:`run_identity`). limit: the run's segment limit, the progress
    total until the corpus has been read. sharded: checkpoint, resume and progress (:class:`ShardedRun`).

    Raises:
        BertologyError: a checkpoint of another run, or a worker that failed.
    """
    saver = Checkpointer(sharded.checkpoint, run, sharded.checkpoint_seconds)
    found = saver.load() if sharded.resume else None
    done = 0
    if found is not None:
        merged.merge(found.state)
        done = found.shards
    counted = _CountedShards(shards, done, merged.items)
    try:
        for shard, partial in pool.map_ordered(counted):
            merged.merge(partial)
            done = shard.number + 1
            saver.save(done, merged.items, merged)
            if sharded.on_progress is not None:
                sharded.on_progress(merged.items, counted.total(limit))
    except BaseException:
        saver.save(done, merged.items, merged, force=True)  # keep what was merged for --resume
        raise
    saver.save(done, merged.items, merged, force=True)
    return merged


def run_on_shards(
    pool: WorkerPool[Any],
    kind: str,
    source: str | Path,
    batches: Iterable[list[ItemT]],
    merged: AccumulatorT,
    *,
    per_shard: int,
    source_format: str | None = None,
    limit: int | None = None,
    batch_size: int | None = None,
    limit_counts_items: bool = True,
    sharded: ShardedRun = PLAIN_RUN,
    settings: Mapping[str, object] | None = None,
) -> AccumulatorT:
    """Run ``batches`` (a run's batches, in the local run's order) on the pool's workers, in shards of at
    least ``per_shard`` items (:func:`~bertology.cluster.shards.shards_of`), merged into ``merged`` by
    :func:`merge_shards`; returns ``merged`` (whose result times the run from its own creation, after the
    workers' start-up).

    kind, source: what the run is (``"analyze"``, ``"probe-deps"``, ...) and the file or folder it reads.
    With the pool's job, ``source_format``, ``limit``, ``batch_size``, ``per_shard`` and any further
    ``settings`` they identify the run (:func:`run_identity`) for its checkpoint. limit: the most items the
    run reads, also the progress total until the source has been read, unless ``limit_counts_items`` is
    false (a limit on documents of a run whose items are windows). sharded: as in :func:`merge_shards`.

    Raises:
        BertologyError: as :func:`merge_shards`, or ``per_shard`` below 1.
    """
    identity = {"format": source_format, "limit": limit, "batch_size": batch_size, "shard": per_shard}
    return merge_shards(
        pool,
        shards_of(batches, per_shard),
        merged,
        run=run_identity(kind, pool.spec, source, **identity, **(settings or {})),
        limit=limit if limit_counts_items else None,
        sharded=sharded,
    )
