"""Single-head ablation: the score of a classifier with each head removed in turn (gate 0, or its output
replaced by its mean or by its output on another input: :mod:`~bertology.interventions.replacement`).

Michel et al. (2019), Table 1 / Figure 1: removing one head at test time and measuring the change of the
task score. With ``reuse_lower_layers`` (the default) each batch's lower layers run once: removing head
``(l, h)`` changes nothing below layer ``l``, so only layers ``l..L-1`` are recomputed for it
(:mod:`~bertology.interventions.partial`), and batches hold examples of similar length (less padding).
Without it, every head costs one full pass through :func:`~bertology.models.classify.predict_logits`; both
give the same accuracies (the logits agree to float rounding).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bertology.errors import BertologyError
from bertology.interventions.curves import Head, lowest_first
from bertology.interventions.data import LabelledTexts, batches, eval_mode, token_counts
from bertology.interventions.gates import head_gates
from bertology.interventions.partial import logits_from_layer, record_layer_inputs
from bertology.interventions.replacement import HeadReplacement, ZeroReplacement, head_replacement
from bertology.models.classify import accuracy, predict_logits
from bertology.models.loading import LoadedModel
from bertology.progress import Progress, part_of
from bertology.stats.base import head_index_frame


@dataclass
class AblationResult:
    """Accuracy with each single head removed.

    baseline: accuracy with every head (fraction of examples right).
    accuracy: [layers, heads] accuracy with only that head's gate at 0.
    examples: number of examples scored.
    """

    baseline: float
    accuracy: np.ndarray
    examples: int

    @property
    def change(self) -> np.ndarray:
        """[layers, heads] accuracy with the head removed minus the baseline (negative: the head helped)."""
        return self.accuracy - self.baseline

    def removal_order(self) -> list[Head]:
        """Every head, the one whose removal leaves the highest accuracy first (ties: lower layer, head)."""
        return lowest_first(-self.accuracy)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based), ``accuracy``, ``change``."""
        return pd.DataFrame(
            {
                **head_index_frame(*self.accuracy.shape),
                "accuracy": self.accuracy.ravel(),
                "change": self.change.ravel(),
            }
        )


def text_replacement(
    loaded: LoadedModel,
    data: LabelledTexts,
    ablation: str | HeadReplacement,
    *,
    seed: int = 0,
    batch_size: int = 32,
) -> HeadReplacement:
    """The replacement of a removed head's output for the classifier ``loaded`` with ``data`` as the
    reference set: ``ablation`` ``"zero"``, ``"mean"`` or ``"resample"`` (seeded by ``seed``; see
    :mod:`~bertology.interventions.replacement`), or a replacement already built (returned as it is).

    Raises:
        BertologyError: an unknown kind, or a set too small for it.
    """

    def reference(rows: np.ndarray | None, size: int) -> Iterator[tuple[dict[str, torch.Tensor], np.ndarray]]:
        chosen = data if rows is None else data.take(rows)
        for batch in batches(loaded, chosen, batch_size=size):
            yield batch.inputs, batch.rows if rows is None else rows[batch.rows]

    return head_replacement(
        loaded,
        ablation,
        batches=reference,
        lengths=lambda: token_counts(loaded, data),
        seed=seed,
        batch_size=batch_size,
    )


def _single_head_gates(layers: int, heads: int, layer: int, head: int) -> torch.Tensor:
    values = torch.ones(layers, heads)
    values[layer, head] = 0.0
    return values


def _sweep_reusing(
    loaded: LoadedModel,
    data: LabelledTexts,
    batch_size: int,
    on_progress: Progress | None,
    chosen: Sequence[Head] | None = None,
    replacement: HeadReplacement | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(baseline logits [n, labels], logits [layers, heads, n, labels]) with lower layers reused, over
    batches of examples of similar length; with ``chosen`` heads only theirs, [len(chosen), n, labels]
    (a head's logits do not depend on which others are swept); removed heads take ``replacement``
    (``None``: zero)."""
    replace = replacement or ZeroReplacement()
    layers, heads = loaded.num_layers, loaded.num_heads
    sweep = list(np.ndindex(layers, heads)) if chosen is None else list(chosen)
    baseline = np.empty((len(data), loaded.model.config.num_labels), np.float32)
    ablated = np.empty((len(sweep), *baseline.shape), np.float32)
    done, total = 0, len(sweep) * len(data)
    with torch.inference_mode(), eval_mode(loaded):
        for batch in batches(loaded, data, batch_size=batch_size, by_length=True):
            recorded = record_layer_inputs(loaded, batch.inputs)
            baseline[batch.rows] = recorded.logits.float().cpu().numpy()
            replaced = replace(batch.inputs, batch.rows)
            per_head = []  # [len(sweep)] of [examples, labels], where the model runs
            for layer, head in sweep:
                gates = _single_head_gates(layers, heads, layer, head)
                per_head.append(logits_from_layer(loaded, batch.inputs, recorded, layer, gates, replaced))
                done += len(batch.rows)
                if on_progress is not None:
                    on_progress(done, total)
            # one transfer to the host per batch, not one per head
            ablated[:, batch.rows] = torch.stack(per_head).float().cpu().numpy()
    return baseline, ablated if chosen is not None else ablated.reshape(layers, heads, *baseline.shape)


def _sweep_full_passes(
    loaded: LoadedModel, data: LabelledTexts, batch_size: int, on_progress: Progress | None
) -> tuple[np.ndarray, np.ndarray]:
    """(baseline logits, logits [layers, heads, n, labels]), one full pass per head."""
    layers, heads = loaded.num_layers, loaded.num_heads
    baseline = predict_logits(loaded, data.texts, data.texts_b, batch_size=batch_size)
    ablated = np.empty((layers, heads, *baseline.shape), np.float32)
    total = layers * heads * len(data)
    for layer in range(layers):
        for head in range(heads):
            advance = part_of(on_progress, offset=(layer * heads + head) * len(data), total=total)
            with head_gates(loaded, {layer: [head]}):
                ablated[layer, head] = predict_logits(
                    loaded, data.texts, data.texts_b, batch_size=batch_size, on_progress=advance
                )
    return baseline, ablated


def single_head_accuracies(
    loaded: LoadedModel, data: LabelledTexts, heads: Sequence[Head], *, batch_size: int = 32
) -> tuple[float, np.ndarray]:
    """(accuracy with every head, [len(heads)] accuracy with each of ``heads`` removed alone): a part of
    :func:`ablation_sweep` (lower layers reused), with the same numbers, so a sweep can be split by heads
    (:mod:`bertology.cluster.ablation`)."""
    baseline, ablated = _sweep_reusing(loaded, data, batch_size, None, heads)
    return accuracy(baseline, data.labels), np.array([accuracy(logits, data.labels) for logits in ablated])


def ablation_sweep(
    loaded: LoadedModel,
    data: LabelledTexts,
    *,
    batch_size: int = 32,
    reuse_lower_layers: bool = True,
    ablation: str | HeadReplacement = "zero",
    seed: int = 0,
    on_progress: Progress | None = None,
) -> AblationResult:
    """Accuracy of the classifier ``loaded`` on ``data`` with each single head removed.

    reuse_lower_layers: compute each batch's lower layers once (see the module docstring); ``False`` runs a
        full forward pass per head (the reference the fast path is tested against; zero ablation only).
    ablation: what a removed head's output becomes, ``"zero"``, ``"mean"`` or ``"resample"`` over ``data``
        (seeded by ``seed``; see :func:`text_replacement`).
    on_progress: told the example passes done so far, out of ``layers * heads * examples``.

    Raises:
        BertologyError: an unknown ablation, or one other than zero without ``reuse_lower_layers``.
    """
    replacement = text_replacement(loaded, data, ablation, seed=seed, batch_size=batch_size)
    if reuse_lower_layers:
        baseline, ablated = _sweep_reusing(loaded, data, batch_size, on_progress, None, replacement)
    elif replacement.kind == "zero":
        baseline, ablated = _sweep_full_passes(loaded, data, batch_size, on_progress)
    else:
        raise BertologyError("The sweep by full forward passes removes heads by zero ablation only.")
    scores = np.array([[accuracy(logits, data.labels) for logits in row] for row in ablated])
    return AblationResult(accuracy(baseline, data.labels), scores, len(data))
