"""``bertology ablate`` on a Ray cluster: the single-head sweep split by heads, the importance by examples.

Each worker loads the classifier and the task's dev examples once (:class:`AblationJob`). The sweep's
shards are runs of heads: a worker computes the accuracy with each of its heads removed
(:func:`~bertology.interventions.ablation.single_head_scores`; a head's logits do not depend on the
other heads swept, so the accuracies equal a local sweep's exactly). The importance's shards are runs
of whole batches of consecutive examples: a worker returns each batch's sum of ``|dL/dξ|``
(:func:`~bertology.interventions.importance.importance_sums`) and the driver adds them in the local
order, so the importance equals a local run's exactly too. The rest of the study (pruning curves,
attention gradients, structural pruning) runs on the driver
(:func:`~bertology.interventions.run.run_ablation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertology.cluster.driver import ShardedRun, run_on_shards
from bertology.cluster.shards import Shard
from bertology.cluster.workers import WorkerPool
from bertology.interventions.ablation import AblationResult, single_head_scores
from bertology.interventions.curves import Head
from bertology.interventions.importance import IMPORTANCE_BATCH, HeadImportance, importance_sums
from bertology.interventions.run import AblationRun, classifier_task, run_ablation
from bertology.interventions.task import ClassifierTask, Task
from bertology.models.loading import LoadedModel, ModelSpec
from bertology.progress import Progress

#: Shards per worker of each measure: few enough that a shard's own lower-layer passes cost little, enough
#: that the workers finish together.
SHARDS_PER_WORKER = 2


@dataclass(frozen=True)
class AblationJob:
    """What every worker of a distributed ablation needs (picklable): the classifier (a
    :class:`~bertology.models.loading.ModelSpec` with ``classifier=True``: a run folder or hub name every node
    can read), the task folder (likewise), how many dev examples and the sweep's batch size."""

    model: ModelSpec
    task: str
    max_dev: int | None = None
    batch_size: int = 32

    def start(self) -> HeadMeasurer:
        """Runs once on each worker: loads the classifier and reads the task's dev examples."""
        loaded = self.model.load()
        task, _ = classifier_task(loaded, self.task, self.max_dev)
        return HeadMeasurer(self, task)


@dataclass
class SweepTally:
    """Single-head accuracies of some heads of a ``layers x heads`` classifier measured on ``examples`` dev
    examples (an :class:`~bertology.accumulator.Accumulator` of the sweep): items (heads done), baseline
    (accuracy with every head; ``None`` before any head), accuracies (head -> accuracy with it removed)."""

    layers: int
    heads: int
    examples: int
    items: int = 0
    baseline: float | None = None
    accuracies: dict[Head, float] = field(default_factory=dict)

    def update(self, heads: list[Head], baseline: float, accuracies: list[float]) -> None:
        """Fold in the accuracies with each of ``heads`` removed and the accuracy with none removed."""
        self.items += len(heads)
        self.baseline = baseline if self.baseline is None else self.baseline
        self.accuracies |= dict(zip(heads, accuracies, strict=True))

    def merge(self, other: SweepTally) -> SweepTally:
        self.items += other.items
        self.baseline = other.baseline if self.baseline is None else self.baseline
        self.accuracies |= other.accuracies
        return self

    def result(self) -> AblationResult:
        grid = np.full((self.layers, self.heads), np.nan)
        for (layer, head), value in self.accuracies.items():
            grid[layer, head] = value
        return AblationResult(float("nan") if self.baseline is None else self.baseline, grid, self.examples)


@dataclass
class ImportanceTally:
    """Importance sums of runs of examples of a ``layers x heads`` classifier (an
    :class:`~bertology.accumulator.Accumulator` of the importance): items (examples done), batches (each
    batch's size and ``[layers, heads]`` float64 sum of ``|dL/dξ|``, in the examples' order)."""

    layers: int
    heads: int
    items: int = 0
    batches: list[tuple[int, np.ndarray]] = field(default_factory=list)

    def update(self, rows: int, batch_sum: np.ndarray) -> None:
        """Fold in one batch of ``rows`` examples and its ``[layers, heads]`` sum."""
        self.items += rows
        self.batches.append((rows, batch_sum))

    def merge(self, other: ImportanceTally) -> ImportanceTally:
        self.items += other.items
        self.batches.extend(other.batches)
        return self

    def result(self) -> HeadImportance:
        """The sums added in order, as :func:`~bertology.interventions.importance.head_importance` does."""
        total = np.zeros((self.layers, self.heads))
        for _, batch_sum in self.batches:
            total += batch_sum
        return HeadImportance(total / max(self.items, 1), self.items)


class HeadMeasurer:
    """A worker's started :class:`AblationJob`: a shard of heads (the sweep) or of example numbers (the
    importance), measured on its loaded classifier."""

    def __init__(self, job: AblationJob, task: ClassifierTask) -> None:
        self.job, self.task = job, task

    def run(self, shard: Shard[Head] | Shard[int]) -> SweepTally | ImportanceTally:
        """A shard of heads: their single-head accuracies. A shard of example numbers (consecutive, in
        whole batches of :data:`IMPORTANCE_BATCH`): the importance sums of its batches."""
        items = [item for batch in shard.batches for item in batch]
        match items[0]:
            case (int(), int()):
                heads = [(int(layer), int(head)) for layer, head in items]
                baseline, accuracies = single_head_scores(self.task, heads, batch_size=self.job.batch_size)
                loaded = self.task.loaded
                sweep = SweepTally(loaded.num_layers, loaded.num_heads, len(self.task))
                sweep.update(heads, baseline, accuracies.tolist())
                return sweep
            case _:
                loaded, data = self.task.loaded, self.task.data
                examples = ClassifierTask(loaded, data.part(shard.first_segment, shard.end_segment))
                importance = ImportanceTally(loaded.num_layers, loaded.num_heads)
                for rows, batch_sum in importance_sums(examples, batch_size=IMPORTANCE_BATCH):
                    importance.update(rows, batch_sum)
                return importance


def ablate_on_pool(
    pool: WorkerPool[AblationJob],
    loaded: LoadedModel,
    *,
    prune_fraction: float = 0.5,
    pruned_dir: str | Path | None = None,
    on_progress: Progress | None = None,
    attribution_examples: int = 200,
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

    def sweep(task: Task, report: Progress | None) -> AblationResult:
        passes = layers * heads * len(task)

        def heads_done(done: int, total: int | None = None, *, stage: str = "") -> None:
            if report is not None:  # as the local sweep counts: example passes
                report(done * len(task), passes)

        every_head = [[(layer, head)] for layer, head in np.ndindex(layers, heads)]
        tally = run_on_shards(
            pool,
            "ablate-sweep",
            job.task,
            every_head,
            SweepTally(layers, heads, len(task)),
            per_shard=-(-len(every_head) // shards),
            batch_size=job.batch_size,
            sharded=ShardedRun(on_progress=heads_done),
        )
        return tally.result()

    def importance(task: Task, report: Progress | None) -> HeadImportance:
        rows = range(len(task))
        batches = [list(rows[start : start + IMPORTANCE_BATCH]) for start in rows[::IMPORTANCE_BATCH]]
        tally = run_on_shards(
            pool,
            "ablate-importance",
            job.task,
            batches,
            ImportanceTally(layers, heads),
            per_shard=max(1, -(-len(task) // shards)),
            batch_size=IMPORTANCE_BATCH,
            sharded=ShardedRun(on_progress=report),
        )
        return tally.result()

    return run_ablation(
        *classifier_task(loaded, job.task, job.max_dev),
        batch_size=job.batch_size,
        prune_fraction=prune_fraction,
        pruned_dir=pruned_dir,
        on_progress=on_progress,
        sweep=sweep,
        importance=importance,
        attribution_examples=attribution_examples,
    )
