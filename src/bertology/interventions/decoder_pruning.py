"""Structural pruning of a decoder, measured by its language-model loss and checked against gating.

The weights are removed by :func:`bertology.models.surgery.prune_model` (with grouped-query attention a
key/value head goes only with the last of its query heads); the pruned copy must compute what the original
computes with the same heads gated to 0, which :func:`prune_decoder` measures on the data (the largest
difference of their next-token logits) beside the loss, size and speed of both models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertology.interventions.data import eval_mode
from bertology.interventions.gates import head_gates
from bertology.interventions.language_model import (
    TokenSequences,
    language_model_loss,
    require_language_model,
    token_batches,
)
from bertology.interventions.pruning import PrunedHeads, pruned_copy
from bertology.models.anatomy import attention_parts
from bertology.models.heads import HeadSelection
from bertology.models.loading import LoadedModel


@dataclass
class DecoderPruning(PrunedHeads):
    """A pruned copy of a decoder measured against the original on the same sequences.

    heads: the removed query heads, ``{layer: [head, ...]}`` (0-based). total_heads: query heads of the
        original. key_value_heads, total_key_value_heads: key/value heads the pruned copy and the original
        compute (fewer only where all the query heads of one are removed).
    loss, gated_loss, baseline_loss: language-model loss (nats per token) of the pruned copy, of the
        original with the same heads gated to 0, and of the original.
    largest_difference: the largest ``|logit|`` difference between the pruned copy and the gated original
        over every real token of the sequences (float rounding only).
    seconds, baseline_seconds: fastest timed forward pass over all the batches, the two models taking
        turns (:func:`~bertology.interventions.pruning.inference_seconds`). parameters, baseline_parameters:
        number of weights.
    """

    heads: dict[int, list[int]]
    total_heads: int
    key_value_heads: int
    total_key_value_heads: int
    loss: float
    gated_loss: float
    baseline_loss: float
    largest_difference: float
    seconds: float
    baseline_seconds: float
    parameters: int
    baseline_parameters: int

    def to_dict(self) -> dict[str, object]:
        return {
            "heads_removed": self.removed,
            "total_heads": self.total_heads,
            "key_value_heads_removed": self.total_key_value_heads - self.key_value_heads,
            "total_key_value_heads": self.total_key_value_heads,
            "removed": {str(layer): heads for layer, heads in self.heads.items()},
            "loss": self.loss,
            "gated_loss": self.gated_loss,
            "baseline_loss": self.baseline_loss,
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


def _largest_difference(
    pruned: LoadedModel, loaded: LoadedModel, heads: HeadSelection, data: TokenSequences
) -> float:
    largest = 0.0
    with torch.inference_mode(), eval_mode(loaded), eval_mode(pruned):
        for inputs, _ in token_batches(loaded, data):
            with head_gates(loaded, heads):
                gated = loaded.model(**inputs).logits
            real = inputs["attention_mask"].bool()
            difference = (pruned.model(**inputs).logits - gated)[real].abs().max()
            largest = max(largest, float(difference))
    return largest


def prune_decoder(
    loaded: LoadedModel,
    heads: HeadSelection,
    data: TokenSequences,
    *,
    batch_size: int = 8,
    repeats: int = 3,
) -> tuple[LoadedModel, DecoderPruning]:
    """A pruned copy of the decoder ``loaded`` without ``heads`` (``loaded`` is left as it is), and its
    loss, its agreement with gating and its inference time on ``data`` against the original's.

    Raises:
        BertologyError: a model without a language-modelling head or whose projections bertology does not
            know.
    """
    require_language_model(loaded)
    encoded = [inputs for inputs, _ in token_batches(loaded, data, batch_size=batch_size)]
    pruned, shared = pruned_copy(loaded, heads, encoded, repeats=repeats)
    outcome = DecoderPruning(
        **shared,
        key_value_heads=key_value_heads(pruned),
        total_key_value_heads=key_value_heads(loaded),
        loss=language_model_loss(pruned, data, batch_size=batch_size),
        gated_loss=language_model_loss(loaded, data, gates=heads, batch_size=batch_size),
        baseline_loss=language_model_loss(loaded, data, batch_size=batch_size),
        largest_difference=_largest_difference(pruned, loaded, heads, data),
    )
    return pruned, outcome
