"""``bertology compare`` on a Ray cluster: both models' analyses and their cross-model distances, from
many workers, equal to one machine's.

Each worker loads both models once (:class:`ComparisonJob`) and folds a shard into fresh
:class:`~bertology.analysis.comparison.ComparisonAccumulators` numbered from the shard's first segment; the
driver merges them in shard order (:func:`~bertology.cluster.driver.run_on_shards`), as
:mod:`bertology.cluster.analyze` does for one model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertology.analysis.comparison import ComparisonAccumulators, ModelComparison, comparison_batches
from bertology.analysis.settings import DEFAULT_SETTINGS, AnalysisSettings
from bertology.cluster.driver import PLAIN_RUN, ShardedRun, run_on_shards
from bertology.cluster.shards import SHARD_SEGMENTS, Shard
from bertology.cluster.workers import WorkerPool
from bertology.corpus.cache import CacheUse
from bertology.models.loading import LoadedModel, ModelSpec
from bertology.options import Level


@dataclass(frozen=True)
class ComparisonJob:
    """What every worker of a distributed comparison needs (picklable): the two models to load and where
    (:class:`~bertology.models.loading.ModelSpec`), the run's
    :class:`~bertology.analysis.settings.AnalysisSettings` and the comparison's level."""

    model_a: ModelSpec
    model_b: ModelSpec
    settings: AnalysisSettings = DEFAULT_SETTINGS
    level: Level = "auto"

    def start(self) -> ShardComparer:
        """Runs once on each worker: loads both models."""
        return ShardComparer(self, self.model_a.load(), self.model_b.load())

    def accumulators(
        self, model_a: LoadedModel, model_b: LoadedModel, *, corpus: str | Path = "", first_segment: int = 0
    ) -> ComparisonAccumulators:
        """Empty accumulators with these settings, numbering segments from ``first_segment``."""
        return ComparisonAccumulators(
            model_a, model_b, self.settings, level=self.level, corpus=corpus, first_segment=first_segment
        )


class ShardComparer:
    """A worker's started :class:`ComparisonJob`: both loaded models, run over one shard at a time."""

    def __init__(self, job: ComparisonJob, model_a: LoadedModel, model_b: LoadedModel) -> None:
        self.job, self.models = job, (model_a, model_b)

    def run(self, shard: Shard) -> ComparisonAccumulators:
        """The shard's accumulators (sent back without the models)."""
        accumulators = self.job.accumulators(*self.models, first_segment=shard.first_segment)
        for batch in shard.batches:
            accumulators.update(batch)
        return accumulators


def compare_on_pool(
    pool: WorkerPool[ComparisonJob],
    corpus: str | Path,
    model_a: LoadedModel,
    model_b: LoadedModel,
    *,
    segments_per_shard: int = SHARD_SEGMENTS,
    sharded: ShardedRun = PLAIN_RUN,
    readers: int | None = None,
) -> ModelComparison:
    """Compare the two models on ``corpus`` on the pool's workers; the result equals
    ``compare_models(model_a, model_b, corpus, settings, level=...)`` with the settings and level of the
    pool's job.

    model_a, model_b: the job's models on the driver (A's tokenizer segments the corpus). Other options
    as in :func:`bertology.cluster.analyze.analyze_on_pool`.

    Raises:
        BertologyError: as :func:`~bertology.analysis.comparison.compare_models`, a checkpoint of another
            run, or a worker that failed.
    """
    settings = pool.spec.settings
    uses: list[CacheUse] = []  # how the pass uses the cache, told as it starts
    merged = run_on_shards(
        pool,
        "compare",
        corpus,
        comparison_batches(corpus, model_a, model_b, settings, readers or 1, uses.append),
        pool.spec.accumulators(model_a, model_b, corpus=corpus),
        per_shard=segments_per_shard,
        limit=settings.limit,
        sharded=sharded,
    )
    return merged.result().with_cache(uses[0])
