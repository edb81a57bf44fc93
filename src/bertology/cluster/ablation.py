"""``bertology ablate`` on a Ray cluster: the single-head sweep split by heads, the importance by examples.

Each worker loads the classifier and the task's dev examples once (:class:`AblationJob`). The sweep's
shards are runs of heads: a worker computes the accuracy with each of its heads removed
(:func:`~bertology.interventions.ablation.single_head_accuracies`; a head's logits do not depend on the
other heads swept, so the accuracies equal a local sweep's exactly). The importance's shards are runs
of whole batches of consecutive examples: a worker returns each batch's sum of ``|dL/dξ|``
(:func:`~bertology.interventions.importance.importance_sums`) and the driver adds them in the local
order, so the importance equals a local run's exactly too. The rest of the study (pruning curves,
attention gradients, structural pruning) runs on the driver
(:func:`~bertology.interventions.run.run_ablation`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertology.cluster.driver import ShardedRun, run_on_shards
from bertology.cluster.shards import Shard
from bertology.cluster.workers import WorkerPool
from bertology.interventions.ablation import AblationResult, single_head_accuracies
from bertology.interventions.curves import Head
from bertology.interventions.data import LabelledTexts
from bertology.interventions.importance import HeadImportance, importance_sums
from bertology.interventions.run import AblationRun, Progress, dev_examples, run_ablation
from bertology.models import LoadedModel, ModelSpec

#: Shards per worker of each measure: few enough that a shard's own lower-layer passes cost little, enough
#: that the workers finish together.
SHARDS_PER_WORKER = 2

#: Examples per batch of the importance (as :func:`~bertology.interventions.importance.head_importance`).
IMPORTANCE_BATCH = 16


@dataclass(frozen=True)
class AblationJob:
    """What every worker of a distributed ablation needs (picklable): the classifier (a
    :class:`~bertology.models.ModelSpec` with ``classifier=True``: a run folder or hub name every node can
    read), the task folder (likewise), how many dev examples and the sweep's batch size."""

    model: ModelSpec
    task: str
    max_dev: int | None = None
    batch_size: int = 32

    def start(self) -> HeadMeasurer:
        """Runs once on each worker: loads the classifier and reads the task's dev examples."""
        loaded = self.model.load()
        _, data = dev_examples(loaded, self.task, self.max_dev)
        return HeadMeasurer(self, loaded, data)


@dataclass
class SweepTally:
    """Single-head accuracies of some heads: segments (heads done, for progress), baseline (accuracy with
    every head; ``None`` before any head), accuracies (head -> accuracy with it removed)."""

    segments: int = 0
    baseline: float | None = None
    accuracies: dict[Head, float] = field(default_factory=dict)

    def merge(self, other: SweepTally) -> SweepTally:
        self.segments += other.segments
        self.baseline = other.baseline if self.baseline is None else self.baseline
        self.accuracies |= other.accuracies
        return self

    def result(self, layers: int, heads: int, examples: int) -> AblationResult:
        grid = np.full((layers, heads), np.nan)
        for (layer, head), value in self.accuracies.items():
            grid[layer, head] = value
        return AblationResult(float("nan") if self.baseline is None else self.baseline, grid, examples)


@dataclass
class ImportanceTally:
    """Importance sums of runs of examples: segments (examples done), batches (each batch's size and
    ``[layers, heads]`` float64 sum of ``|dL/dξ|``, in the examples' order)."""

    segments: int = 0
    batches: list[tuple[int, np.ndarray]] = field(default_factory=list)

    def merge(self, other: ImportanceTally) -> ImportanceTally:
        self.segments += other.segments
        self.batches.extend(other.batches)
        return self

    def result(self, layers: int, heads: int) -> HeadImportance:
        """The sums added in order, as :func:`~bertology.interventions.importance.head_importance` does."""
        total = np.zeros((layers, heads))
        for _, batch_sum in self.batches:
            total += batch_sum
        return HeadImportance(total / max(self.segments, 1), self.segments)


class HeadMeasurer:
    """A worker's started :class:`AblationJob`: a shard of heads (the sweep) or of example numbers (the
    importance), measured on its loaded classifier."""

    def __init__(self, job: AblationJob, loaded: LoadedModel, data: LabelledTexts) -> None:
        self.job, self.loaded, self.data = job, loaded, data

    def run(self, shard: Shard[Head] | Shard[int]) -> SweepTally | ImportanceTally:
        """A shard of heads: their single-head accuracies. A shard of example numbers (consecutive, in
        whole batches of :data:`IMPORTANCE_BATCH`): the importance sums of its batches."""
        items = [item for batch in shard.batches for item in batch]
        match items[0]:
            case (int(), int()):
                heads = [(int(layer), int(head)) for layer, head in items]
                baseline, accuracies = single_head_accuracies(
                    self.loaded, self.data, heads, batch_size=self.job.batch_size
                )
                return SweepTally(len(heads), baseline, dict(zip(heads, accuracies.tolist(), strict=True)))
            case _:
                examples = self.data.part(shard.first_segment, shard.end_segment)
                sums = list(importance_sums(self.loaded, examples, batch_size=IMPORTANCE_BATCH))
                return ImportanceTally(len(examples), sums)


def ablate_on_pool(
    pool: WorkerPool[AblationJob],
    loaded: LoadedModel,
    *,
    prune_fraction: float = 0.5,
    pruned_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> AblationRun:
    """:func:`~bertology.interventions.run.run_ablation` of the job's classifier and task with the
    single-head sweep and the importance on the pool's workers; the same numbers.

    loaded: the job's classifier on the driver (it runs the rest of the study).

    Raises:
        BertologyError: as :func:`~bertology.interventions.run.run_ablation`, or a worker that failed.
    """
    job = pool.spec
    layers, heads = loaded.num_layers, loaded.num_heads
    shards = len(pool.actors) * SHARDS_PER_WORKER

    def sweep(data: LabelledTexts, report: Callable[[int], None]) -> AblationResult:
        every_head = [[(layer, head)] for layer, head in np.ndindex(layers, heads)]
        tally, _ = run_on_shards(
            pool,
            "ablate-sweep",
            job.task,
            every_head,
            SweepTally(),
            per_shard=-(-len(every_head) // shards),
            batch_size=job.batch_size,
            sharded=ShardedRun(on_progress=lambda done, _: report(done * len(data))),
        )
        return tally.result(layers, heads, len(data))

    def importance(data: LabelledTexts, report: Callable[[int], None]) -> HeadImportance:
        rows = range(len(data))
        batches = [list(rows[start : start + IMPORTANCE_BATCH]) for start in rows[::IMPORTANCE_BATCH]]
        tally, _ = run_on_shards(
            pool,
            "ablate-importance",
            job.task,
            batches,
            ImportanceTally(),
            per_shard=max(1, -(-len(data) // shards)),
            batch_size=IMPORTANCE_BATCH,
            sharded=ShardedRun(on_progress=lambda done, _: report(done)),
        )
        return tally.result(layers, heads)

    return run_ablation(
        loaded,
        job.task,
        max_dev=job.max_dev,
        batch_size=job.batch_size,
        prune_fraction=prune_fraction,
        pruned_dir=pruned_dir,
        progress=progress,
        sweep=sweep,
        importance=importance,
    )
