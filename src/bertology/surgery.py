"""Remove attention heads from a model's weights, and rebuild a saved model whose heads were removed.

Removing head ``h`` of a layer drops rows ``h * d .. (h + 1) * d`` of its query, key and value projections
(weights and biases) and the same columns of its output projection (``d`` = features per head), which
computes exactly what gating the head to 0 computes (:func:`bertology.hook.gating`). The removed heads are
recorded in the model's config under :data:`PRUNED_HEADS_KEY` (``{"layer": [heads]}``, 0-based, original
head numbers), so a saved pruned model loads again: :func:`load_pruned` (called by
:func:`bertology.models.load_model`) builds the model from its config, shrinks the same layers and then
reads the saved weights.

A layer keeps at least one head's weights: when all its heads are removed, one stays with its value
weights and bias set to zero, so its output is zero and the layer computes what the gated model computes.
ALBERT shares one layer's weights between all layers, so its heads cannot be removed from one layer
alone; gate them instead. The projections are found through :mod:`bertology.anatomy`; the intervention
built on this (prune a loaded classifier, measure it) is :mod:`bertology.interventions.pruning`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from bertology.anatomy import AttentionParts, attention_parts, shares_layers
from bertology.errors import BertologyError
from bertology.heads import HeadSelection, heads_by_layer
from bertology.hook import KEPT_HEADS

#: Config entry of a structurally pruned model: the heads removed per layer.
PRUNED_HEADS_KEY = "bertology_pruned_heads"


def pruned_heads(config: PretrainedConfig) -> dict[int, list[int]]:
    """The heads removed from a model with ``config`` (``{}`` for an unpruned model)."""
    recorded = getattr(config, PRUNED_HEADS_KEY, None) or {}
    return {int(layer): sorted(int(head) for head in heads) for layer, heads in recorded.items()}


def _rows(head_slots: list[int], head_dim: int) -> torch.Tensor:
    """Feature indices of the given head slots (``[len(slots) * head_dim]``)."""
    return torch.tensor([slot * head_dim + offset for slot in head_slots for offset in range(head_dim)])


def _select(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A copy of ``linear`` keeping only ``index`` along ``dim`` of its weight (0: outputs, 1: inputs)."""
    weight = linear.weight.index_select(dim, index.to(linear.weight.device)).detach().clone()
    bias = linear.bias
    if bias is not None and dim == 0:
        bias = bias.index_select(0, index.to(bias.device))
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


def _prune_layer(owner: nn.Module, parts: AttentionParts, remove: set[int], num_heads: int) -> None:
    """Remove the original heads ``remove`` from one layer of ``owner`` (see the module docstring)."""
    kept = list(getattr(parts.module, KEPT_HEADS, range(num_heads)))
    survivors = [head for head in kept if head not in remove]
    index = _rows([kept.index(head) for head in survivors or kept[:1]], parts.head_dim)
    projections = {linear: _select(linear, index, 0) for linear in (parts.query, parts.key, parts.value)}
    projections[parts.output] = _select(parts.output, index, 1)
    for old, new in projections.items():
        _replace(owner, old, new)
    if not survivors:
        value = projections[parts.value]
        with torch.no_grad():
            value.weight.zero_()
            if value.bias is not None:
                value.bias.zero_()
        survivors = kept[:1]
    setattr(parts.module, KEPT_HEADS, survivors)
    for name in ("num_attention_heads", "n_heads"):
        if hasattr(parts.module, name):
            setattr(parts.module, name, len(survivors))
    if hasattr(parts.module, "all_head_size"):
        parts.module.all_head_size = len(survivors) * parts.head_dim


def prune_model(model: PreTrainedModel, heads: HeadSelection) -> None:
    """Remove ``heads`` (original numbering; ones already removed are ignored) from ``model`` in place and
    record every removed head in its config.

    Raises:
        BertologyError: an ALBERT model, or a head outside the model.
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
