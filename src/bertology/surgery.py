"""Remove attention heads from a model's weights, and rebuild a saved model whose heads were removed.

Removing head ``h`` of a layer drops its ``d`` rows (``d`` = features per head) from the layer's query, key
and value projections (weights and biases; in a fused projection such as ModernBERT's ``Wqkv`` or
DeBERTa's ``in_proj``, its rows of all three), from any further per-head projection and per-head bias
(DeBERTa's relative-position projections, ``q_bias`` and ``v_bias``), and the same ``d`` columns from its
output projection, which computes exactly what gating the head to 0 computes
(:func:`bertology.hook.gating`). Per-head values computed once for all layers (MPNet's relative position
bias) are narrowed to the heads a layer keeps as they enter it. The removed heads are recorded in the
model's config under :data:`PRUNED_HEADS_KEY` (``{"layer": [heads]}``, 0-based, original head numbers),
so a saved pruned model loads again: :func:`load_pruned` (called by :func:`bertology.models.load_model`)
builds the model from its config, shrinks the same layers and then reads the saved weights.

A layer keeps at least one head's weights: when all its heads are removed, one stays with its output
projection columns set to zero, so the layer adds only the projection's bias, as the gated model does.
ALBERT shares one layer's weights between all layers, so its heads cannot be removed from one layer
alone; gate them instead. The projections are found through :mod:`bertology.anatomy`; the intervention
built on this (prune a loaded classifier, measure it) is :mod:`bertology.interventions.pruning`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from bertology.anatomy import AttentionParts, Projection, attention_parts, shares_layers
from bertology.errors import BertologyError
from bertology.heads import HeadSelection, heads_by_layer
from bertology.hook import KEPT_HEADS

#: Config entry of a structurally pruned model: the heads removed per layer.
PRUNED_HEADS_KEY = "bertology_pruned_heads"


def pruned_heads(config: PretrainedConfig) -> dict[int, list[int]]:
    """The heads removed from a model with ``config`` (``{}`` for an unpruned model)."""
    recorded = getattr(config, PRUNED_HEADS_KEY, None) or {}
    return {int(layer): sorted(int(head) for head in heads) for layer, heads in recorded.items()}


def _select(linear: nn.Linear, index: list[int], dim: int) -> nn.Linear:
    """A copy of ``linear`` keeping only ``index`` along ``dim`` of its weight (0: outputs, 1: inputs)."""
    positions = torch.tensor(index, device=linear.weight.device)
    weight = linear.weight.index_select(dim, positions).detach().clone()
    bias = linear.bias
    if bias is not None and dim == 0:
        bias = bias.index_select(0, positions)
    smaller = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    smaller = smaller.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        smaller.weight.copy_(weight)
        if bias is not None:
            smaller.bias.copy_(bias)
    return smaller


def _replace(module: nn.Module, old: nn.Linear, new: nn.Linear) -> None:
    """Put ``new`` wherever ``old`` is a direct child of ``module`` or of its children."""
    for parent in module.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)


def _shrink_projections(owner: nn.Module, parts: AttentionParts, slots: list[int]) -> nn.Linear:
    """Keep only head ``slots`` in every projection with per-head output rows (several on one fused
    ``Linear`` keep the union of their rows, in their order), in the separate per-head biases and in the
    output projection's columns; returns the new output projection."""
    rows: dict[nn.Linear, set[int]] = {}
    projections: list[Projection] = [parts.query, parts.key, parts.value, *parts.per_head]
    for projection in projections:
        rows.setdefault(projection.linear, set()).update(projection.rows(slots, parts.head_dim))
    for linear, kept in rows.items():
        _replace(owner, linear, _select(linear, sorted(kept), 0))
    features = [slot * parts.head_dim + offset for slot in slots for offset in range(parts.head_dim)]
    for name in {projection.bias for projection in projections if projection.bias is not None}:
        bias = getattr(parts.module, name)
        narrower = nn.Parameter(bias.detach()[features].clone(), requires_grad=bias.requires_grad)
        setattr(parts.module, name, narrower)
    output = _select(parts.output, features, 1)
    _replace(owner, parts.output, output)
    return output


class _KeptHeadsOf:
    """Forward pre-hook of a pruned self-attention module whose argument ``position`` holds per-head values
    ``[batch, heads, query, key]`` for all the model's heads (MPNet's position bias): keep its heads'."""

    def __init__(self, position: int) -> None:
        self.position = position

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        values = args[self.position] if len(args) > self.position else None
        if values is None:
            return None
        kept = torch.tensor(getattr(module, KEPT_HEADS), device=values.device)
        return (*args[: self.position], values.index_select(1, kept), *args[self.position + 1 :])


def _prune_layer(owner: nn.Module, parts: AttentionParts, remove: set[int], num_heads: int) -> None:
    """Remove the original heads ``remove`` from one layer of ``owner`` (see the module docstring)."""
    attention = parts.module
    kept = list(getattr(attention, KEPT_HEADS, range(num_heads)))
    survivors = [head for head in kept if head not in remove]
    staying = survivors or kept[:1]
    output = _shrink_projections(owner, parts, [kept.index(head) for head in staying])
    if not survivors:
        with torch.no_grad():
            output.weight.zero_()
    if parts.head_argument is not None and not hasattr(attention, KEPT_HEADS):
        attention.register_forward_pre_hook(_KeptHeadsOf(parts.head_argument))
    setattr(attention, KEPT_HEADS, staying)
    for name in ("num_attention_heads", "n_heads"):
        if hasattr(attention, name):
            setattr(attention, name, len(staying))
    if hasattr(attention, "all_head_size"):
        attention.all_head_size = len(staying) * parts.head_dim


def prune_model(model: PreTrainedModel, heads: HeadSelection) -> None:
    """Remove ``heads`` (original numbering; ones already removed are ignored) from ``model`` in place and
    record every removed head in its config.

    Raises:
        BertologyError: an ALBERT model, a model type bertology does not describe, or a head outside the
            model.
    """
    if shares_layers(model):
        raise BertologyError(
            "ALBERT shares one set of attention weights between all layers, so a head cannot be removed "
            "from one layer alone; gate it instead (head_gates)."
        )
    parts = attention_parts(model)
    num_heads = int(getattr(model.config, "num_attention_heads", None) or model.config.n_heads)
    selected = heads_by_layer(heads, len(parts), num_heads)
    removed = pruned_heads(model.config)
    for layer, layer_heads in selected.items():
        _prune_layer(model, parts[layer], set(layer_heads) | set(removed.get(layer, [])), num_heads)
        removed[layer] = sorted(set(removed.get(layer, [])) | set(layer_heads))
    setattr(model.config, PRUNED_HEADS_KEY, {str(layer): heads for layer, heads in sorted(removed.items())})


def load_pruned(auto_class: type, source: str | Path, config: PretrainedConfig) -> PreTrainedModel:
    """A pruned model saved in ``source``: built from ``config``, shrunk as recorded there, then loaded
    with the saved weights (every weight must match: a pruned model keeps its own classifier).

    Raises:
        BertologyError: no weights in ``source``, or weights of other shapes than the config describes.
    """
    files = sorted(Path(source).glob("*.safetensors"))
    if not files:
        raise BertologyError(f"The pruned model in '{source}' has no .safetensors weights.")
    model = auto_class.from_config(config, attn_implementation="eager")
    prune_model(model, pruned_heads(config))
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as error:
        first = str(error).splitlines()[1].strip() if "\n" in str(error) else str(error)
        raise BertologyError(f"The weights in '{source}' do not fit its pruned config: {first}") from error
    return model
