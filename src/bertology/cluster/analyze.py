"""``bertology analyze`` on a Ray cluster: the same statistics as one machine, from many workers.

The driver reads and segments the corpus exactly as :func:`bertology.analyze.analyze_corpus` does and
cuts the batches into shards (:mod:`bertology.cluster.shards`); each worker loads the model once
(:class:`AnalysisJob`) and folds a shard into fresh :class:`~bertology.analyze.CorpusAccumulators`
numbered from the shard's first segment; the driver merges the returned accumulators in shard order
(:func:`~bertology.cluster.driver.run_on_shards`). The JS divergences sample query tokens by
``[seed, segment number]`` and a pattern's best segment is kept by number, so the result equals a local
run's (sums in another order: about 1e-16 relative).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertology.analyze import CorpusAccumulators, CorpusAnalysis, corpus_batches
from bertology.cluster.driver import PLAIN_RUN, ShardedRun, run_on_shards
from bertology.cluster.shards import SHARD_SEGMENTS, Shard
from bertology.cluster.workers import WorkerPool
from bertology.models import LoadedModel, ModelSpec
from bertology.norms import Weights
from bertology.options import (
    BATCH_SIZE,
    EXAMPLES_PER_HEAD,
    JS_TOKENS_PER_SEGMENT,
)
from bertology.stats.surface import Convention


@dataclass(frozen=True)
class AnalysisJob:
    """What every worker of a distributed analysis needs (picklable): the model to load and where
    (:class:`~bertology.models.ModelSpec`), and the settings of
    :class:`~bertology.analyze.CorpusAccumulators`."""

    model: ModelSpec
    max_length: int = 128
    seed: int = 0
    js_tokens_per_segment: int | None = JS_TOKENS_PER_SEGMENT
    weights: Weights = "attention"
    convention: Convention = "bertology"
    examples_per_head: int = EXAMPLES_PER_HEAD

    def start(self) -> ShardAnalyser:
        """Runs once on each worker: loads the model."""
        return ShardAnalyser(self, self.model.load())

    def accumulators(self, loaded: LoadedModel, first_segment: int = 0) -> CorpusAccumulators:
        """Empty accumulators with these settings, numbering segments from ``first_segment``."""
        return CorpusAccumulators(
            loaded,
            js_tokens_per_segment=self.js_tokens_per_segment,
            seed=self.seed,
            weights=self.weights,
            convention=self.convention,
            first_segment=first_segment,
            examples_per_head=self.examples_per_head,
        )


class ShardAnalyser:
    """A worker's started :class:`AnalysisJob`: its loaded model, run over one shard at a time."""

    def __init__(self, job: AnalysisJob, loaded: LoadedModel) -> None:
        self.job, self.loaded = job, loaded

    def run(self, shard: Shard) -> CorpusAccumulators:
        """The shard's accumulators (sent back without the model)."""
        accumulators = self.job.accumulators(self.loaded, shard.first_segment)
        for batch in shard.batches:
            accumulators.add(batch, self.job.max_length)
        return accumulators


def analyze_on_pool(
    pool: WorkerPool[AnalysisJob],
    corpus: str | Path,
    loaded: LoadedModel,
    *,
    limit: int | None = None,
    batch_size: int = BATCH_SIZE,
    corpus_format: str | None = None,
    segments_per_shard: int = SHARD_SEGMENTS,
    sharded: ShardedRun = PLAIN_RUN,
) -> CorpusAnalysis:
    """Analyse ``corpus`` on the pool's workers; the result equals ``analyze_corpus(corpus, loaded, ...)``
    with the settings of the pool's job (to about 1e-16 relative; see the module docstring).

    loaded: the job's model on the driver (its tokenizer segments the corpus). limit, batch_size,
    corpus_format: as in :func:`~bertology.analyze.analyze_corpus`. segments_per_shard: the unit of work
    (:func:`~bertology.cluster.shards.shards_of`). sharded: checkpoint, resume and progress
    (:class:`~bertology.cluster.driver.ShardedRun`). ``seconds`` of the result counts from the first
    shard, not the workers' start-up (:attr:`WorkerPool.startup_seconds`).

    Raises:
        BertologyError: as :func:`~bertology.analyze.analyze_corpus`, a checkpoint of another run, or a
            worker that failed.
    """
    job = pool.spec
    batches = corpus_batches(
        corpus,
        loaded.tokenizer,
        max_length=job.max_length,
        limit=limit,
        batch_size=batch_size,
        corpus_format=corpus_format,
        pairs=loaded.kind == "encoder",
    )
    merged, seconds = run_on_shards(
        pool,
        "analyze",
        corpus,
        batches,
        job.accumulators(loaded),
        per_shard=segments_per_shard,
        source_format=corpus_format,
        limit=limit,
        batch_size=batch_size,
        sharded=sharded,
    )
    return merged.result(corpus, corpus_format=corpus_format, max_length=job.max_length, seconds=seconds)
