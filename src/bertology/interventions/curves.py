"""Pruning curves: the score after removing more and more heads (gate 0, or their outputs replaced:
:mod:`~bertology.interventions.replacement`) in a given order.

Michel et al. (2019), Figure 2: heads are ranked once (by single-head ablation or by importance) and
removed least useful first; the score is measured after each step, all other heads kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertology.interventions.replacement import HeadReplacement
from bertology.interventions.task import Task
from bertology.progress import Progress

#: A head as ``(layer, head)``, 0-based.
Head = tuple[int, int]


def lowest_first(scores: np.ndarray) -> list[Head]:
    """Every head of ``scores`` [layers, heads], lowest score first (ties: lower layer, then lower head)."""
    heads = scores.shape[1]
    return [(int(index // heads), int(index % heads)) for index in np.argsort(scores.ravel(), kind="stable")]


def removal_counts(total: int) -> list[int]:
    """How many heads to remove at each point of a curve: 0, 3, 10, 20, 30, ... and finally ``total``."""
    return sorted({0, *(count for count in (3, *range(10, total, 10)) if count < total), total})


def pruning_curve(
    task: Task,
    order: Sequence[Head],
    counts: Sequence[int],
    *,
    replacement: HeadReplacement | None = None,
    batch_size: int = 8,
    on_progress: Progress | None = None,
) -> np.ndarray:
    """[len(counts)] ``task``'s score with the first ``count`` heads of ``order`` removed (gate 0), their
    outputs replaced by ``replacement`` (from :meth:`~bertology.interventions.task.Task.replacement`;
    ``None``: zero).

    on_progress: told the curve points done, out of ``len(counts)``.
    """
    scores = []
    for done, count in enumerate(counts, start=1):
        scores.append(
            task.evaluate(gates=list(order[:count]), replacement=replacement, batch_size=batch_size)
        )
        if on_progress is not None:
            on_progress(done, len(counts))
    return np.array(scores)
