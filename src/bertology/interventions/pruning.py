"""Structural pruning as an intervention: remove heads from a loaded classifier, save it, and measure the
smaller model's accuracy, size and speed against the original.

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

from bertology.interventions.data import LabelledTexts, batches, eval_mode
from bertology.models.classify import accuracy, predict_logits
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


class PrunedHeads:
    """What a structural pruning's outcome derives from its removed ``heads`` (``{layer: [head, ...]}``)
    and its timings (``seconds``, ``baseline_seconds``): the outcomes of classifiers and of decoders."""

    heads: dict[int, list[int]]
    seconds: float
    baseline_seconds: float

    @property
    def removed(self) -> int:
        return sum(len(heads) for heads in self.heads.values())

    @property
    def speedup(self) -> float:
        """How many times faster the pruned model ran (original seconds / pruned seconds)."""
        return self.baseline_seconds / self.seconds

    def to_dict(self) -> dict[str, object]:
        """The outcome as JSON values (``summary.json``'s ``pruning``)."""
        raise NotImplementedError


@dataclass
class PruningOutcome(PrunedHeads):
    """A pruned copy of a classifier measured against the original on the same examples and batches.

    heads: the removed heads, ``{layer: [head, ...]}`` (0-based). total_heads: heads of the original.
    accuracy, baseline_accuracy: of the pruned and of the original model.
    seconds, baseline_seconds: fastest timed forward pass over all the batches, the two models taking
        turns (see :func:`inference_seconds`). parameters, baseline_parameters: number of weights.
    """

    heads: dict[int, list[int]]
    total_heads: int
    accuracy: float
    baseline_accuracy: float
    seconds: float
    baseline_seconds: float
    parameters: int
    baseline_parameters: int

    def to_dict(self) -> dict[str, object]:
        return {
            "heads_removed": self.removed,
            "total_heads": self.total_heads,
            "removed": {str(layer): heads for layer, heads in self.heads.items()},
            "accuracy": self.accuracy,
            "baseline_accuracy": self.baseline_accuracy,
            "seconds": self.seconds,
            "baseline_seconds": self.baseline_seconds,
            "speedup": self.speedup,
            "parameters": self.parameters,
            "baseline_parameters": self.baseline_parameters,
        }


def pruned_copy(
    loaded: LoadedModel, heads: HeadSelection, inputs: Sequence[dict], *, repeats: int = 3
) -> tuple[LoadedModel, dict[str, Any]]:
    """A pruned copy of ``loaded`` without ``heads`` (``loaded`` is left as it is) and what every pruning
    outcome (a classifier's and a decoder's) holds of it: the removed ``heads``, ``total_heads``, the
    inference ``seconds`` of both models on the batches ``inputs`` and both models' ``parameters``."""
    pruned = wrap_model(copy.deepcopy(loaded.model), loaded.tokenizer, f"{loaded.name} (pruned)")
    prune_model(pruned.model, heads)
    seconds = inference_seconds([pruned, loaded], inputs, repeats=repeats)
    return pruned, {
        "heads": pruned_heads(pruned.model.config),
        "total_heads": loaded.num_layers * loaded.num_heads,
        "seconds": seconds[0],
        "baseline_seconds": seconds[1],
        "parameters": count_parameters(pruned.model),
        "baseline_parameters": count_parameters(loaded.model),
    }


def prune_and_measure(
    loaded: LoadedModel,
    heads: HeadSelection,
    data: LabelledTexts,
    *,
    batch_size: int = 32,
    repeats: int = 3,
) -> tuple[LoadedModel, PruningOutcome]:
    """A pruned copy of ``loaded`` without ``heads`` (``loaded`` is left as it is), and its accuracy and
    inference time on ``data`` against the original's (same batches, forward passes only)."""
    encoded = [batch.inputs for batch in batches(loaded, data, batch_size=batch_size)]
    pruned, shared = pruned_copy(loaded, heads, encoded, repeats=repeats)
    scores = [
        accuracy(predict_logits(model, data.texts, data.texts_b, batch_size=batch_size), data.labels)
        for model in (pruned, loaded)
    ]
    return pruned, PruningOutcome(**shared, accuracy=scores[0], baseline_accuracy=scores[1])
