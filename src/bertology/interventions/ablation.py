"""Single-head ablation: a task's score with each head removed in turn (gate 0, or its output replaced by
its mean or by its output on another input: :mod:`~bertology.interventions.replacement`), for a classifier's
accuracy and a language model's loss alike (:mod:`~bertology.interventions.task`).

Michel et al. (2019), Table 1 / Figure 1: removing one head at test time and measuring the change of the
task score. With ``reuse_lower_layers`` (the default) each batch's lower layers run once: removing head
``(l, h)`` changes nothing below layer ``l``, so only layers ``l..L-1`` are recomputed for it
(:mod:`~bertology.interventions.partial`), and a classifier's batches hold examples of similar length (less
padding). Without it, every head costs one full pass per batch; both give the same scores (the logits agree
to float rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bertology.interventions.curves import Head, lowest_first
from bertology.interventions.data import eval_mode
from bertology.interventions.gates import head_gates, row_stacks
from bertology.interventions.partial import logits_from_layer, record_layer_inputs
from bertology.interventions.replacement import HeadReplacement, ZeroReplacement
from bertology.interventions.task import ACCURACY, Inputs, Score, Task
from bertology.models.heads import head_columns
from bertology.progress import Progress

#: What the sweep keeps of each example's logits: ``measure(logits, inputs, rows)`` -> [batch, ...].
Measure = Callable[[torch.Tensor, Inputs, np.ndarray], torch.Tensor]


@dataclass
class AblationResult:
    """A task's score with each single head removed.

    baseline: the score with every head. scores: [layers, heads] the score with only that head's gate at 0
    (NaN for heads not swept). count: examples (a classifier) or predicted tokens (a language model)
    averaged over. score: how the score reads (its name in the files, which direction is better).
    stacks: an encoder-decoder's ``(stack, layer)`` of each row of ``scores`` (its gate rows), else ``None``.
    """

    baseline: float
    scores: np.ndarray
    count: int
    score: Score = ACCURACY
    stacks: list[tuple[str, int]] | None = None

    @property
    def change(self) -> np.ndarray:
        """[layers, heads] score with the head removed minus the baseline (the head helped where this is
        negative for a score where higher is better, positive for a loss)."""
        return self.scores - self.baseline

    def removal_order(self) -> list[Head]:
        """Every head, the one whose removal leaves the best score first (ties: lower layer, head)."""
        return lowest_first(-self.scores if self.score.higher_is_better else self.scores)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based; an encoder-decoder's ``stack`` first), the score
        by its name (``accuracy``, ``loss``) and ``change``."""
        return pd.DataFrame(
            {
                **head_columns(*self.scores.shape, self.stacks),
                self.score.name: self.scores.ravel(),
                "change": self.change.ravel(),
            }
        )


def sweep_outputs(
    task: Task,
    measure: Measure,
    *,
    heads: Sequence[Head] | None = None,
    batch_size: int = 8,
    replacement: HeadReplacement | None = None,
    reuse_lower_layers: bool = True,
    on_progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(baseline [examples, ...], ablated [len(heads), examples, ...]) of ``measure`` applied to the
    model's logits on ``task``'s examples, with every head and with each of ``heads`` (default: every head,
    layer by layer) removed alone, taking ``replacement`` (``None``: zero). A head's values do not depend on
    which others are swept.

    reuse_lower_layers: compute each batch's lower layers once (batches of similar length where the task
        allows); ``False`` (always for an encoder-decoder): one full forward pass per head and batch.
    on_progress: told the example passes done so far, out of ``len(heads) * examples``.
    """
    loaded = task.loaded
    replace = replacement or ZeroReplacement()
    reuse_lower_layers = reuse_lower_layers and loaded.kind != "encoder-decoder"
    layers, per_layer = loaded.gate_layers, loaded.num_heads
    sweep = list(np.ndindex(layers, per_layer)) if heads is None else list(heads)
    baseline: np.ndarray | None = None
    ablated: np.ndarray | None = None
    done, total = 0, len(sweep) * len(task)
    with torch.inference_mode(), eval_mode(loaded):
        for inputs, rows in task.batches(batch_size, by_length=reuse_lower_layers):
            recorded = record_layer_inputs(loaded, inputs) if reuse_lower_layers else None
            logits = loaded.model(**inputs).logits if recorded is None else recorded.logits
            values = measure(logits, inputs, rows).cpu().numpy()
            if baseline is None or ablated is None:
                baseline = np.empty((len(task), *values.shape[1:]), values.dtype)
                ablated = np.empty((len(sweep), *baseline.shape), values.dtype)
            baseline[rows] = values
            replaced = replace(inputs, rows)
            per_head = []  # [len(sweep)] of [examples, ...], where the model runs
            for layer, head in sweep:
                if recorded is not None:
                    gates = torch.ones(layers, per_layer)
                    gates[layer, head] = 0.0
                    logits = logits_from_layer(loaded, inputs, recorded, layer, gates, replaced)
                else:
                    with head_gates(loaded, {layer: [head]}, replaced):
                        logits = loaded.model(**inputs).logits
                per_head.append(measure(logits, inputs, rows))
                done += len(rows)
                if on_progress is not None:
                    on_progress(done, total)
            # one transfer to the host per batch, not one per head
            ablated[:, rows] = torch.stack(per_head).cpu().numpy()
    assert baseline is not None and ablated is not None, "a task has examples"
    return baseline, ablated


def single_head_scores(
    task: Task, heads: Sequence[Head], *, batch_size: int = 8, replacement: HeadReplacement | None = None
) -> tuple[float, np.ndarray]:
    """(the score with every head, [len(heads)] the score with each of ``heads`` removed alone): a part of
    :func:`ablation_sweep` with the same numbers, so a sweep can be split by heads
    (:mod:`bertology.cluster.ablation`)."""
    baseline, ablated = sweep_outputs(
        task, task.parts, heads=heads, batch_size=batch_size, replacement=replacement
    )
    return task.ratio(baseline), np.array([task.ratio(parts) for parts in ablated])


def ablation_sweep(
    task: Task,
    *,
    heads: Sequence[Head] | None = None,
    batch_size: int = 8,
    reuse_lower_layers: bool = True,
    ablation: str | HeadReplacement = "zero",
    seed: int = 0,
    on_progress: Progress | None = None,
) -> AblationResult:
    """``task``'s score with each head removed alone (``heads``: only those, the others' cells NaN).

    reuse_lower_layers: compute each batch's lower layers once (see the module docstring); ``False`` runs a
        full forward pass per head (the reference the fast path is tested against).
    ablation: what a removed head's output becomes, ``"zero"``, ``"mean"`` or ``"resample"`` over the task's
        examples (seeded by ``seed``; see :meth:`~bertology.interventions.task.Task.replacement`).
    on_progress: told the example passes done so far, out of ``heads * examples``.

    Raises:
        BertologyError: an unknown ablation, or a language model with no token to predict.
    """
    replacement = task.replacement(ablation, seed=seed, batch_size=batch_size)
    sweep = list(np.ndindex(task.loaded.gate_layers, task.loaded.num_heads)) if heads is None else list(heads)
    baseline, ablated = sweep_outputs(
        task,
        task.parts,
        heads=sweep,
        batch_size=batch_size,
        replacement=replacement,
        reuse_lower_layers=reuse_lower_layers,
        on_progress=on_progress,
    )
    scores = np.full((task.loaded.gate_layers, task.loaded.num_heads), np.nan)
    for (layer, head), parts in zip(sweep, ablated, strict=True):
        scores[layer, head] = task.ratio(parts)
    count = int(baseline[:, 1].sum())
    return AblationResult(task.ratio(baseline), scores, count, task.score, row_stacks(task.loaded))
