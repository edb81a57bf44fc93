"""The head measurements of an ablation study (:mod:`~bertology.interventions.run`) on any
:class:`~bertology.interventions.task.Task`: the single-head sweep, Michel et al.'s importance, and the
pruning curves by both rankings (and any other) and in a seeded random order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bertology.interventions.ablation import AblationResult, ablation_sweep
from bertology.interventions.curves import Head, pruning_curve, removal_counts
from bertology.interventions.importance import IMPORTANCE_BATCH, HeadImportance, head_importance
from bertology.interventions.replacement import HeadReplacement
from bertology.interventions.task import Task
from bertology.progress import Progress, part_of

#: Measures every head on the task's examples, reporting progress as :func:`ablation_sweep` (example
#: passes) or :func:`head_importance` (examples) does: in this process by default, on a cluster's workers in
#: :mod:`bertology.cluster.ablation`.
SweepMeasure = Callable[[Task, Progress | None], AblationResult]
ImportanceMeasure = Callable[[Task, Progress | None], HeadImportance]


def random_order(layers: int, heads: int, seed: int) -> list[Head]:
    """Every head of a ``layers`` x ``heads`` model in a seeded random order."""
    return [
        (int(i // heads), int(i % heads)) for i in np.random.default_rng(seed).permutation(layers * heads)
    ]


@dataclass
class HeadMeasures:
    """:func:`measure_heads`'s results (see :class:`~bertology.interventions.run.AblationRun`) and the
    replacement they used."""

    ablation: AblationResult
    importance: HeadImportance
    counts: list[int]
    curves: dict[str, np.ndarray]
    replacement: HeadReplacement
    orders: dict[str, list[Head]] = field(default_factory=dict)


def measure_heads(
    task: Task,
    *,
    batch_size: int,
    replacement: HeadReplacement,
    random_seed: int = 0,
    importance_batch_size: int = IMPORTANCE_BATCH,
    sweep: SweepMeasure | None = None,
    importance: ImportanceMeasure | None = None,
    more_orders: Callable[[], dict[str, list[Head]]] | None = None,
    on_progress: Progress | None = None,
) -> HeadMeasures:
    """The single-head sweep (removed heads taking ``replacement``), the importance, and the pruning curves
    by ablation, importance, ``more_orders()`` (computed after the importance) and a random order, each
    stage told to ``on_progress`` under its name.

    sweep, importance: where the single-head ablation and the importance run (default: here).
    """
    sweep_stage = part_of(on_progress, stage="Ablating single heads")
    importance_stage = part_of(on_progress, stage="Head importance")
    if sweep is None:
        single = ablation_sweep(task, batch_size=batch_size, ablation=replacement, on_progress=sweep_stage)
    else:
        single = sweep(task, sweep_stage)
    if importance is None:
        ranked = head_importance(task, batch_size=importance_batch_size, on_progress=importance_stage)
    else:
        ranked = importance(task, importance_stage)
    layers, heads = task.loaded.gate_layers, task.loaded.num_heads
    orders = {
        "ablation": single.removal_order(),
        "importance": ranked.removal_order(),
        **({} if more_orders is None else more_orders()),
        "random": random_order(layers, heads, random_seed),
    }
    counts = removal_counts(layers * heads)
    curves = {
        name: pruning_curve(
            task,
            order,
            counts,
            replacement=replacement,
            batch_size=batch_size,
            on_progress=part_of(on_progress, stage=f"Pruning curve by {name}"),
        )
        for name, order in orders.items()
    }
    return HeadMeasures(single, ranked, counts, curves, replacement, orders)
