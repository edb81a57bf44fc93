"""Structural pruning as an intervention: remove heads from a task's model (a classifier, a decoder; with
grouped-query attention a key/value head goes only with the last of its query heads), save it, and measure
the smaller model's score (:mod:`~bertology.interventions.task`), its agreement with gating the same heads,
its size and its speed against the original.

The weight surgery itself (and the rebuilding of a saved pruned model, which ``load_model`` does) is
:mod:`bertology.models.surgery`: removing a head computes exactly what gating it to 0 computes
(:mod:`~bertology.interventions.gates`), and the removed heads are recorded in the model's config
(:func:`~bertology.models.surgery.pruned_heads`). ALBERT shares one layer's weights between all layers, so its
heads cannot be removed from one layer alone; gate them instead.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertology.interventions.data import eval_mode
from bertology.interventions.gates import head_gates
from bertology.interventions.task import Score, Task
from bertology.models.anatomy import attention_parts
from bertology.models.heads import HeadSelection
from bertology.models.loading import RUN_MODEL_FOLDER, LoadedModel, wrap_model
from bertology.models.surgery import prune_model, pruned_heads


def prune_heads(loaded: LoadedModel, heads: HeadSelection) -> LoadedModel:
    """Remove ``heads`` from ``loaded``'s model in place (see :func:`~bertology.models.surgery.prune_model`);
    returns ``loaded``."""
    prune_model(loaded.model, heads)
    return loaded


def save_model(loaded: LoadedModel, run_dir: str | Path) -> Path:
    """Save ``loaded``'s model and tokenizer as a run folder (``run_dir/model/``) that
    ``load_model(run_dir, classifier=True)`` loads again; returns the model folder. The weights keep the
    model's own names (no conversion to an original checkpoint layout, such as GTE's fused ``qkv_proj``),
    which :func:`~bertology.models.surgery.load_pruned` reads as they are."""
    target = Path(run_dir) / RUN_MODEL_FOLDER
    loaded.model.save_pretrained(target, save_original_format=False)
    loaded.tokenizer.save_pretrained(target)
    return target


def count_parameters(model: nn.Module) -> int:
    """Number of weights of ``model``."""
    return sum(parameter.numel() for parameter in model.parameters())


def inference_seconds(
    models: Sequence[LoadedModel], encoded: Iterable[dict[str, torch.Tensor]], *, repeats: int = 3
) -> list[float]:
    """For each model, the fastest of ``repeats`` timed passes over the batches ``encoded`` (each the
    model's inputs; seconds of wall time, forward passes only: no tokenization). The models take turns in
    every round, so a machine that gets busier or quieter slows them alike; one untimed round warms up
    first."""
    batches = list(encoded)
    timings: list[list[float]] = [[] for _ in models]
    for attempt in range(repeats + 1):
        for model, times in zip(models, timings, strict=True):
            with torch.inference_mode(), eval_mode(model):
                start = time.perf_counter()
                for inputs in batches:
                    model.model(**inputs)
                if attempt > 0:
                    times.append(time.perf_counter() - start)
    return [min(times) for times in timings]


@dataclass
class Pruning:
    """A pruned copy of a task's model (a classifier, a decoder) measured against the original on the
    task's examples, in the same batches.

    heads: the removed (query) heads, ``{layer: [head, ...]}`` (0-based). total_heads: (query) heads of the
        original. key_value_heads, total_key_value_heads: key/value heads the pruned copy and the original
        compute (with grouped-query attention, fewer only where all the query heads of one are removed).
    score: how the task's score reads. value, gated, baseline: the score of the pruned copy, of the
        original with the same heads gated to 0, and of the original.
    largest_difference: the largest ``|logit|`` difference between the pruned copy and the gated original
        over every scored position of the examples (float rounding only).
    seconds, baseline_seconds: fastest timed forward pass over all the batches, the two models taking
        turns (:func:`inference_seconds`). parameters, baseline_parameters: number of weights.
    """

    heads: dict[int, list[int]]
    total_heads: int
    key_value_heads: int
    total_key_value_heads: int
    score: Score
    value: float
    gated: float
    baseline: float
    largest_difference: float
    seconds: float
    baseline_seconds: float
    parameters: int
    baseline_parameters: int

    @property
    def removed(self) -> int:
        return sum(len(heads) for heads in self.heads.values())

    @property
    def speedup(self) -> float:
        """How many times faster the pruned model ran (original seconds / pruned seconds)."""
        return self.baseline_seconds / self.seconds

    @property
    def grouped(self) -> bool:
        """Whether the model's query heads share key/value heads (grouped-query attention)."""
        return self.total_key_value_heads != self.total_heads

    def to_dict(self) -> dict[str, object]:
        """The outcome as JSON values (``summary.json``'s ``pruning``): the scores as ``score``,
        ``gated_score`` and ``baseline_score`` and by the score's name too (``accuracy``,
        ``baseline_accuracy``, ``gated_accuracy``; ``loss``, ...)."""
        name = self.score.name
        return {
            "heads_removed": self.removed,
            "total_heads": self.total_heads,
            "key_value_heads_removed": self.total_key_value_heads - self.key_value_heads,
            "total_key_value_heads": self.total_key_value_heads,
            "removed": {str(layer): heads for layer, heads in self.heads.items()},
            "score_name": name,
            "higher_is_better": self.score.higher_is_better,
            "score": self.value,
            "gated_score": self.gated,
            "baseline_score": self.baseline,
            name: self.value,
            f"gated_{name}": self.gated,
            f"baseline_{name}": self.baseline,
            "largest_logit_difference_to_gated": self.largest_difference,
            "seconds": self.seconds,
            "baseline_seconds": self.baseline_seconds,
            "speedup": self.speedup,
            "parameters": self.parameters,
            "baseline_parameters": self.baseline_parameters,
        }


def key_value_heads(loaded: LoadedModel) -> int:
    """Key/value heads ``loaded`` computes now, summed over its layers."""
    return sum(parts.key_value_heads for parts in attention_parts(loaded.model))


def pruned_copy(
    loaded: LoadedModel, heads: HeadSelection, inputs: Sequence[dict], *, repeats: int = 3
) -> tuple[LoadedModel, dict[str, Any]]:
    """A pruned copy of ``loaded`` without ``heads`` (``loaded`` is left as it is) and what
    :class:`Pruning` holds of it: the removed ``heads``, the (query) and key/value heads of both, the
    inference ``seconds`` of both models on the batches ``inputs`` and both models' ``parameters``."""
    pruned = wrap_model(copy.deepcopy(loaded.model), loaded.tokenizer, f"{loaded.name} (pruned)")
    prune_model(pruned.model, heads)
    seconds = inference_seconds([pruned, loaded], inputs, repeats=repeats)
    return pruned, {
        "heads": pruned_heads(pruned.model.config),
        "total_heads": loaded.num_layers * loaded.num_heads,
        "key_value_heads": key_value_heads(pruned),
        "total_key_value_heads": key_value_heads(loaded),
        "seconds": seconds[0],
        "baseline_seconds": seconds[1],
        "parameters": count_parameters(pruned.model),
        "baseline_parameters": count_parameters(loaded.model),
    }


def largest_difference(task: Task, pruned: Task, heads: HeadSelection, *, batch_size: int = 8) -> float:
    """The largest ``|logit|`` difference between ``pruned`` (``task`` on the pruned copy) and ``task``'s
    model with ``heads`` gated to 0, over the positions of the examples that are scored
    (:attr:`~bertology.interventions.task.Task.token_mask`)."""
    largest = 0.0
    with torch.inference_mode(), eval_mode(task.loaded), eval_mode(pruned.loaded):
        for inputs, _ in task.batches(batch_size):
            with head_gates(task.loaded, heads):
                gated = task.loaded.model(**inputs).logits
            difference = (pruned.loaded.model(**inputs).logits - gated).abs()
            if task.token_mask is not None:
                difference = difference[inputs[task.token_mask].bool()]
            largest = max(largest, float(difference.max()))
    return largest


def prune_and_measure(
    task: Task, heads: HeadSelection, *, batch_size: int = 32, repeats: int = 3
) -> tuple[LoadedModel, Pruning]:
    """A pruned copy of ``task``'s model without ``heads`` (the model is left as it is), and its score, its
    agreement with gating and its inference time on the task's examples against the original's (same
    batches, forward passes only).

    Raises:
        BertologyError: a model whose heads cannot be removed (see
            :func:`~bertology.models.surgery.check_prunable`).
    """
    encoded = [inputs for inputs, _ in task.batches(batch_size)]
    pruned, shared = pruned_copy(task.loaded, heads, encoded, repeats=repeats)
    on_pruned = task.on(pruned)
    outcome = Pruning(
        **shared,
        score=task.score,
        value=on_pruned.evaluate(batch_size=batch_size),
        gated=task.evaluate(gates=heads, batch_size=batch_size),
        baseline=task.evaluate(batch_size=batch_size),
        largest_difference=largest_difference(task, on_pruned, heads, batch_size=batch_size),
    )
    return pruned, outcome
