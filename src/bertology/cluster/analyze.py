"""``bertology analyze`` on a Ray cluster: the same statistics as one machine, from many workers.

The driver reads and segments the corpus exactly as :func:`bertology.analysis.analyze.analyze_corpus` does and
cuts the batches into shards (:mod:`bertology.cluster.shards`); each worker loads the model once
(:class:`AnalysisJob`) and folds a shard into fresh :class:`~bertology.analysis.analyze.CorpusAccumulators`
numbered from the shard's first segment; the driver merges the returned accumulators in shard order
(:func:`~bertology.cluster.driver.run_on_shards`). The JS divergences sample query tokens by
``[seed, segment number]`` and a pattern's best segment is kept by number, so the result equals a local
run's (sums in another order: about 1e-16 relative).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bertology.analysis.analyze import CorpusAccumulators, CorpusAnalysis, corpus_batches
from bertology.analysis.settings import DEFAULT_SETTINGS, AnalysisSettings
from bertology.cluster.driver import PLAIN_RUN, ShardedRun, run_on_shards
from bertology.cluster.shards import SHARD_SEGMENTS, Shard
from bertology.cluster.workers import WorkerPool
from bertology.corpus.cache import CacheUse
from bertology.models.loading import LoadedModel, ModelSpec


@dataclass(frozen=True)
class AnalysisJob:
    """What every worker of a distributed analysis needs (picklable): the model to load and where
    (:class:`~bertology.models.loading.ModelSpec`) and the run's
    :class:`~bertology.analysis.settings.AnalysisSettings`."""

    model: ModelSpec
    settings: AnalysisSettings = DEFAULT_SETTINGS

    def start(self) -> ShardAnalyser:
        """Runs once on each worker: loads the model."""
        return ShardAnalyser(self, self.model.load())

    def accumulators(
        self, loaded: LoadedModel, *, corpus: str | Path = "", first_segment: int = 0
    ) -> CorpusAccumulators:
        """Empty accumulators with these settings, numbering segments from ``first_segment``."""
        return CorpusAccumulators(loaded, self.settings, corpus=corpus, first_segment=first_segment)


class ShardAnalyser:
    """A worker's started :class:`AnalysisJob`: its loaded model, run over one shard at a time."""

    def __init__(self, job: AnalysisJob, loaded: LoadedModel) -> None:
        self.job, self.loaded = job, loaded

    def run(self, shard: Shard) -> CorpusAccumulators:
        """The shard's accumulators (sent back without the model)."""
        accumulators = self.job.accumulators(self.loaded, first_segment=shard.first_segment)
        for batch in shard.batches:
            accumulators.update(batch)
        return accumulators


def analyze_on_pool(
    pool: WorkerPool[AnalysisJob],
    corpus: str | Path,
    loaded: LoadedModel,
    *,
    segments_per_shard: int = SHARD_SEGMENTS,
    sharded: ShardedRun = PLAIN_RUN,
    readers: int | None = None,
) -> CorpusAnalysis:
    """Analyse ``corpus`` on the pool's workers; the result equals ``analyze_corpus(corpus, loaded,
    settings)`` with the settings of the pool's job (to about 1e-16 relative; see the module docstring).

    loaded: the job's model on the driver (its tokenizer segments the corpus). segments_per_shard: the unit
    of work (:func:`~bertology.cluster.shards.shards_of`). sharded: checkpoint, resume and progress
    (:class:`~bertology.cluster.driver.ShardedRun`). readers: processes that read the corpus on the driver
    (:func:`~bertology.analysis.analyze.corpus_batches`; ``None``: 1). ``seconds`` of the result counts
    from the first shard, not the workers' start-up (:attr:`WorkerPool.startup_seconds`).

    Raises:
        BertologyError: as :func:`~bertology.analysis.analyze.analyze_corpus`, a checkpoint of another run,
            or a worker that failed.
    """
    settings = pool.spec.settings
    uses: list[CacheUse] = []  # how the pass uses the cache, told as it starts
    batches = corpus_batches(
        corpus,
        loaded.tokenizer,
        max_length=settings.max_length,
        limit=settings.limit,
        batch_size=settings.batch_size,
        corpus_format=settings.corpus_format,
        pairs=loaded.kind == "encoder",
        cache=settings.cache,
        readers=readers or 1,
        on_cache=uses.append,
        model=loaded.name,
    )
    merged = run_on_shards(
        pool,
        "analyze",
        corpus,
        batches,
        pool.spec.accumulators(loaded, corpus=corpus),
        per_shard=segments_per_shard,
        limit=settings.limit,
        sharded=sharded,
    )
    return replace(merged.result(), corpus_cache=uses[0])
