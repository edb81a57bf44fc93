"""Norm-based attention weights (Kobayashi et al. 2020, "Attention is Not Only a Weight").

A head's output for query token ``i`` is ``sum_j a_ij f(x_j)``, where ``a_ij`` is the attention weight
and ``f(x_j) = (x_j W_V + b_V) W_O`` is token ``j``'s value vector carried through the head's own block
of the layer's output projection (the output bias is shared by all tokens and left out, as in the
paper). A large weight on a vector of small norm moves little: Kobayashi et al. weigh each attended
token by ``||a_ij f(x_j)|| = a_ij ||f(x_j)||`` instead.

bertology normalises each row so that it sums to 1, which keeps every view and statistic meaningful
(they treat a row as a distribution)::

    w_ij = a_ij ||f(x_j)|| / sum_k a_ik ||f(x_k)||

``||f(x_j)||`` comes from the head's value vector ``v_j`` (``head_dim`` features) and the Gram matrix of
the head's columns of the output projection: ``||f(x_j)||^2 = v_j^T (W_O^h)^T W_O^h v_j``. The value
vectors are the ones the attention function receives where transformers' ``AttentionInterface`` computes
the attention; for models that compute it in their own code (DeBERTa, MPNet, ...), the value projection's
own output in the same forward pass, taken by a forward hook (:class:`NormWeighting`). The projections
of every encoder type are found through :mod:`bertology.models.anatomy`.
"""

from __future__ import annotations

import weakref
from typing import Any, get_args

import torch
from torch import nn
from transformers import PreTrainedModel

from bertology.errors import BertologyError
from bertology.models.anatomy import AttentionParts, attention_parts
from bertology.models.hook import active_recorder
from bertology.models.sites import hook_module
from bertology.options import Weights

#: The attention weights bertology can show and measure: the softmax output, or the norm-based weights.
WEIGHTS: tuple[Weights, ...] = get_args(Weights)
WEIGHT_DESCRIPTIONS: dict[Weights, str] = {
    "attention": "attention weights (softmax output)",
    "norm": "norm-based weights ||a f(x)|| (Kobayashi et al. 2020), rows normalised to sum to 1",
}


def check_weights(weights: str) -> Weights:
    """``weights`` if it names one of :data:`WEIGHTS`, else a :class:`BertologyError`."""
    if weights not in WEIGHTS:
        raise BertologyError(f"Unknown weights '{weights}'; choose one of {', '.join(WEIGHTS)}.")
    return weights  # type: ignore[return-value]


def output_grams(model: PreTrainedModel, layers: list[AttentionParts] | None = None) -> list[torch.Tensor]:
    """Per layer, ``[heads, head_dim, head_dim]`` float32: ``G_h = (W_O^h)^T W_O^h``, with ``W_O^h`` the
    ``[hidden, head_dim]`` block of the output projection that head ``h``'s output goes through
    (``layers``: the model's :func:`~bertology.models.anatomy.attention_parts`, found when not given).

    Raises:
        BertologyError: an architecture whose attention projections bertology does not know.
    """
    grams = []
    with torch.no_grad():
        for parts in attention_parts(model) if layers is None else layers:
            weight = parts.output_weight().float()  # [hidden, heads * head_dim]
            blocks = weight.reshape(weight.shape[0], -1, parts.head_dim).transpose(0, 1)  # [heads, hidden, d]
            grams.append(blocks.transpose(1, 2) @ blocks)
    return grams


def transformed_norms(value: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """``||f(x_j)||`` [batch, heads, keys] from value vectors ``value`` [batch, heads, keys, head_dim] and
    one layer's :func:`output_grams` ``gram`` [heads, head_dim, head_dim]."""
    squared = torch.einsum("bhkd,hde,bhke->bhk", value.float(), gram.to(value.device), value.float())
    return squared.clamp_min(0).sqrt()


def norm_weights(probs: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """Row-normalised ``a_ij ||f(x_j)||``: ``probs`` [batch, heads, query, key] and ``norms``
    [batch, heads, key] -> [batch, heads, query, key], each row summing to 1 (0 where ``probs`` is 0)."""
    weighted = probs * norms[:, :, None, :].to(probs.dtype)
    return weighted / weighted.sum(-1, keepdim=True).clamp_min(torch.finfo(weighted.dtype).tiny)


class NormWeighting:
    """Turns one attention call's probabilities into norm-based weights: ``weighting(call, probs, value)``
    with ``probs`` [batch, heads, query, key] and ``value`` [batch, heads, key, head_dim], or ``None`` where
    the capture route has no values (models that compute attention in their own code): then the value
    projection's output from the same layer call is used, which a forward hook on every layer's value
    projection keeps while this object is the weighting of the recorder active in the current context
    (so threads never mix). The hooks go when this object is garbage-collected. ``call`` counts attention
    calls; an encoder makes one per layer, in layer order, so call ``c`` is layer ``c mod layers``
    (consecutive forward passes line up).

    keep_norms: also keep each call's ``||f(x_j)||`` [batch, heads, key] in :attr:`norms` (for the
    neuron view, which shows them beside the softmax).

    Raises:
        BertologyError: a model type whose projections bertology does not know, or whose value vectors are
            not the value projection's output (RoFormer with ``rotary_value``).
    """

    def __init__(self, model: PreTrainedModel, *, keep_norms: bool = False) -> None:
        if getattr(model.config, "rotary_value", False):
            raise BertologyError(
                "This RoFormer rotates its value vectors by position (rotary_value=True), so norm-based "
                "weights cannot be computed from its value projection; use the attention weights."
            )
        self.layers = attention_parts(model)
        self.grams = output_grams(model, self.layers)
        self.keep_norms = keep_norms
        self.norms: list[torch.Tensor] = []
        #: The output [batch, tokens, features] of the value projection called last in this context.
        self.projected: torch.Tensor | None = None
        value_projections = {id(parts.value.linear): parts.value.linear for parts in self.layers}
        handles = [
            hook_module(linear, _KeepProjected(weakref.ref(self))) for linear in value_projections.values()
        ]
        weakref.finalize(self, _remove, handles)

    def __call__(self, call: int, probs: torch.Tensor, value: torch.Tensor | None) -> torch.Tensor:
        layer = call % len(self.grams)
        projected, self.projected = self.projected, None
        if value is None:
            if projected is None:
                raise RuntimeError(f"No value projection ran before attention call {call}.")
            value = self.layers[layer].value_vectors(projected.detach())
        gram = self.grams[layer]
        if value.shape[1] != gram.shape[0]:  # grouped-query attention: each query head's own k/v head
            value = value.repeat_interleave(gram.shape[0] // value.shape[1], dim=1)
        norms = transformed_norms(value, gram)
        if self.keep_norms:
            self.norms.append(norms)
        return norm_weights(probs, norms)


class _KeepProjected:
    """Forward hook of a value projection: hand its output to the :class:`NormWeighting` it was put there
    for, when that is the weighting of the recorder active in the current context."""

    def __init__(self, weighting: weakref.ref[NormWeighting]) -> None:
        self.weighting = weighting

    def __call__(
        self, linear: nn.Module, args: tuple[torch.Tensor, ...], kwargs: dict[str, Any], output: torch.Tensor
    ) -> None:
        recorder = active_recorder()
        weighting = self.weighting()
        if recorder is not None and weighting is not None and recorder.weighting is weighting:
            weighting.projected = output


def _remove(handles: list[torch.utils.hooks.RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
