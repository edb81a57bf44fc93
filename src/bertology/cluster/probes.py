"""``bertology probe deps`` and ``probe coref`` on a Ray cluster: the same head accuracies as one machine,
from many workers.

The driver reads the treebank and forms the batches a local run forms
(:func:`~bertology.probes.run.dependency_batches`, each sentence numbered by its place in the treebank),
cut into shards of consecutive batches (:mod:`bertology.cluster.shards`); each worker loads the model
once (:class:`DependencyJob`) and folds a shard into a fresh :class:`~bertology.probes.run.DependencyTally`;
the driver merges the tallies in shard order (:func:`~bertology.cluster.driver.run_on_shards`). The
counts are integers and every batch is the local run's, so the table equals a local run's exactly.

The coreference probe runs the same way: the driver reads the documents and forms the local run's
batches of windows (:func:`~bertology.probes.coreference.coref_batches`; each window carries the counts of
the documents read before it, so a shard counts them once), each worker (:class:`CorefJob`) scores its
shards into a fresh :class:`~bertology.probes.coreference.CorefAccumulator`, and the driver merges them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bertology.attention.words import WordMode
from bertology.cluster.driver import PLAIN_RUN, ShardedRun, run_on_shards
from bertology.cluster.shards import Shard
from bertology.cluster.workers import WorkerPool
from bertology.models.loading import LoadedModel, ModelSpec, require_encoder
from bertology.probes.coreference import CorefAccumulator, CorefItem, score_coref_batches
from bertology.probes.results import CoreferenceResult, DependencyResult
from bertology.probes.run import DependencyTally, NumberedSentence, dependency_batches, probe_coreference

#: Sentences per shard by default: a few seconds of work for a small model on one core.
SHARD_SENTENCES = 128

#: Coreference windows per shard by default (a window is up to the model's length, longer than a sentence).
SHARD_WINDOWS = 32


@dataclass(frozen=True)
class DependencyJob:
    """What every worker of a distributed dependency probe needs (picklable): the model to load and where
    (:class:`~bertology.models.loading.ModelSpec`), the word mode and how many example sentences the run
    keeps."""

    model: ModelSpec
    mode: WordMode = "mean"
    keep_examples: int = 25

    def start(self) -> ShardProber:
        """Runs once on each worker: loads the model."""
        return ShardProber(self, self.model.load())


class ShardProber:
    """A worker's started :class:`DependencyJob`: its loaded model, run over one shard at a time."""

    def __init__(self, job: DependencyJob, loaded: LoadedModel) -> None:
        self.job, self.loaded = job, loaded

    def run(self, shard: Shard[NumberedSentence]) -> DependencyTally:
        """The shard's tally (sentences, counts and the examples among them)."""
        tally = DependencyTally(self.loaded, self.job.mode, keep_examples=self.job.keep_examples)
        for batch in shard.batches:
            tally.update(batch)
        return tally


def probe_dependencies_on_pool(
    pool: WorkerPool[DependencyJob],
    path: str | Path,
    loaded: LoadedModel,
    *,
    treebank_format: str | None = None,
    limit: int | None = None,
    batch_size: int = 16,
    sentences_per_shard: int = SHARD_SENTENCES,
    sharded: ShardedRun = PLAIN_RUN,
) -> DependencyResult:
    """The dependency probe of ``path`` on the pool's workers; equals
    ``probe_dependencies(path, loaded, ...)`` with the job's mode and examples.

    loaded: the job's model on the driver (named in the result). treebank_format, limit, batch_size: as
    in :func:`~bertology.probes.run.probe_dependencies`. sentences_per_shard: the unit of work.
    sharded: checkpoint, resume and progress (:class:`~bertology.cluster.driver.ShardedRun`).

    Raises:
        BertologyError: an unreadable treebank, no sentence that fits the model, a checkpoint of another
            run, or a worker that failed.
    """
    require_encoder(loaded, "Dependency probing")
    job = pool.spec
    batches = dependency_batches(
        path, loaded, treebank_format=treebank_format, limit=limit, batch_size=batch_size
    )
    merged = run_on_shards(
        pool,
        "probe-deps",
        path,
        batches,
        DependencyTally(loaded, job.mode, path=path, keep_examples=job.keep_examples),
        per_shard=sentences_per_shard,
        source_format=treebank_format,
        limit=limit,
        batch_size=batch_size,
        sharded=sharded,
    )
    return merged.result()


@dataclass(frozen=True)
class CorefJob:
    """What every worker of a distributed coreference probe needs (picklable): the model to load and where
    (:class:`~bertology.models.loading.ModelSpec`)."""

    model: ModelSpec

    def start(self) -> ShardCorefScorer:
        """Runs once on each worker: loads the model."""
        return ShardCorefScorer(self.model.load())


class ShardCorefScorer:
    """A worker's started :class:`CorefJob`: its loaded model, run over one shard at a time."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    def run(self, shard: Shard[CorefItem]) -> CorefAccumulator:
        """The shard's counts (its windows scored, the documents its items carry)."""
        return score_coref_batches(shard.batches, self.loaded)


def probe_coreference_on_pool(
    pool: WorkerPool[CorefJob],
    path: str | Path,
    loaded: LoadedModel,
    *,
    treebank: str | Path | None = None,
    coref_format: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    windows_per_shard: int = SHARD_WINDOWS,
    sharded: ShardedRun = PLAIN_RUN,
) -> CoreferenceResult:
    """The coreference probe of ``path`` on the pool's workers; equals ``probe_coreference(path, loaded,
    ...)``. Progress counts windows (the total is known once the corpus has been read).

    loaded: the job's model on the driver (its tokenizer cuts the windows). treebank, coref_format, limit
    (documents), batch_size: as in :func:`~bertology.probes.run.probe_coreference`. windows_per_shard: the
    unit of work. sharded: checkpoint, resume and progress (:class:`~bertology.cluster.driver.ShardedRun`).

    Raises:
        BertologyError: as :func:`~bertology.probes.run.probe_coreference`, or a checkpoint of another run,
            or a worker that failed.
    """

    def score(batches: Iterator[list[CorefItem]]) -> CorefAccumulator:
        return run_on_shards(
            pool,
            "probe-coref",
            path,
            batches,
            CorefAccumulator(),
            per_shard=windows_per_shard,
            source_format=coref_format,
            limit=limit,
            batch_size=batch_size,
            limit_counts_items=False,  # documents; the shards hold windows
            sharded=sharded,
            settings={"treebank": None if treebank is None else str(Path(treebank).resolve())},
        )

    return probe_coreference(
        path,
        loaded,
        treebank=treebank,
        coref_format=coref_format,
        limit=limit,
        batch_size=batch_size,
        score=score,
    )
