"""Remove attention heads from a model's weights, and rebuild a saved model whose heads were removed.

Removing head ``h`` of a layer drops its ``d`` rows (``d`` = features per head) from the layer's query, key
and value projections (weights and biases; in a fused projection such as ModernBERT's ``Wqkv`` or
DeBERTa's ``in_proj``, its rows of all three), from any further per-head projection and per-head bias
(DeBERTa's relative-position projections, ``q_bias`` and ``v_bias``), and the same ``d`` columns from its
output projection, which computes exactly what gating the head to 0 computes
(:func:`bertology.models.hook.gating`). Per-head values computed once for all layers (MPNet's relative
position bias) are narrowed to the heads a layer keeps as they enter it. The removed heads are recorded in the
model's config under :data:`PRUNED_HEADS_KEY` (``{"layer": [heads]}``, 0-based, original head numbers),
so a saved pruned model loads again: :func:`load_pruned` (called by
:func:`bertology.models.loading.load_model`) builds the model from its config, shrinks the same layers and
then reads the saved weights.

With grouped-query attention (Llama, Mistral, Qwen, Gemma: ``num_key_value_groups`` query heads share one
key/value head) a query head loses its rows of ``q_proj`` and its columns of ``o_proj``, and a key/value
head its rows of ``k_proj`` and ``v_proj`` only when all its query heads are removed. The model's
``repeat_kv`` gives every key/value head the same number of query heads, so where the kept key/value heads
keep different numbers of query heads, the ones with fewer also keep some of their removed query heads,
with their output columns set to zero, and each layer's ``num_key_value_groups`` is set to the kept
number (the config's head counts stay the original ones, which gates and the saved record refer to).

A layer keeps at least one head's weights: when all its heads are removed, one stays with its output
projection columns set to zero, so the layer adds only the projection's bias, as the gated model does.
ALBERT shares one layer's weights between all layers, so its heads cannot be removed from one layer
alone; gate them instead. The projections are found through :mod:`bertology.models.anatomy`; the intervention
built on this (prune a loaded classifier, measure it) is :mod:`bertology.interventions.pruning`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from bertology.errors import BertologyError
from bertology.models.anatomy import AttentionParts, attention_parts, shares_layers
from bertology.models.heads import HeadSelection, heads_by_layer
from bertology.models.hook import KEPT_HEADS
from bertology.models.sites import hook_module

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


def _features(slots: list[int], head_dim: int) -> list[int]:
    """Positions of head ``slots``' features among ``heads * head_dim`` side by side."""
    return [slot * head_dim + offset for slot in slots for offset in range(head_dim)]


def _shrink_projections(
    owner: nn.Module, parts: AttentionParts, slots: list[int], shared: list[int]
) -> nn.Linear:
    """Keep only query head ``slots`` (ascending) and key/value head ``shared`` slots (ascending) in every
    projection with per-head output rows (several on one fused ``Linear`` keep the union of their rows, in
    their order), in the separate per-head biases and in the output projection's columns; returns the new
    output projection."""
    rows: dict[nn.Linear, set[int]] = {}
    biases: dict[str, list[int]] = {}
    own_slots = [
        (parts.query, slots),
        (parts.key, shared),
        (parts.value, shared),
        *((projection, slots) for projection in parts.per_head),
    ]
    for projection, kept in own_slots:
        rows.setdefault(projection.linear, set()).update(projection.rows(kept, parts.head_dim))
        if projection.bias is not None:
            biases[projection.bias] = _features(kept, parts.head_dim)
    for linear, kept_rows in rows.items():
        _replace(owner, linear, _select(linear, sorted(kept_rows), 0))
    for name, features in biases.items():
        bias = getattr(parts.module, name)
        narrower = nn.Parameter(bias.detach()[features].clone(), requires_grad=bias.requires_grad)
        setattr(parts.module, name, narrower)
    output = _select(parts.output, _features(slots, parts.head_dim), 1)
    _replace(owner, parts.output, output)
    return output


class _KeptHeadsOf:
    """Forward pre-hook of a pruned self-attention module whose argument ``position`` holds per-head values
    ``[batch, heads, query, key]`` for all the model's heads (MPNet's position bias): keep its heads'."""

    def __init__(self, position: int) -> None:
        self.position = position

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _: None
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        values = args[self.position] if len(args) > self.position else None
        if values is None:
            return None
        kept = torch.tensor(getattr(module, KEPT_HEADS), device=values.device)
        return (*args[: self.position], values.index_select(1, kept), *args[self.position + 1 :]), kwargs


def _slots_to_keep(kept: list[int], remove: set[int], groups: int) -> tuple[list[int], list[int]]:
    """(query slots, key/value slots) a layer keeps, both ascending, given the original numbers ``kept``
    of its query heads by slot, the heads to ``remove`` and the query heads per key/value head ``groups``
    (query slot ``s`` reads key/value slot ``s // groups``).

    A key/value head stays while one of its query heads does. Every kept key/value head must serve the
    same number of query slots (``repeat_kv``), the most survivors any of them has: one with fewer keeps
    some of its removed heads as well (their output columns are zeroed afterwards). A layer whose heads
    all go keeps its first slot."""
    blocks = [list(range(start, start + groups)) for start in range(0, len(kept), groups)]
    survivors = [[slot for slot in block if kept[slot] not in remove] for block in blocks]
    width = max(len(alive) for alive in survivors)
    if width == 0:
        return [0], [0]
    slots: list[int] = []
    shared: list[int] = []
    for index, (block, alive) in enumerate(zip(blocks, survivors, strict=True)):
        if alive:
            fillers = [slot for slot in block if slot not in alive][: width - len(alive)]
            slots.extend(sorted(alive + fillers))
            shared.append(index)
    return slots, shared


def _prune_layer(owner: nn.Module, parts: AttentionParts, remove: set[int], num_heads: int) -> None:
    """Remove the original heads ``remove`` from one layer of ``owner`` (see the module docstring)."""
    attention = parts.module
    kept = list(getattr(attention, KEPT_HEADS, range(num_heads)))
    slots, shared = _slots_to_keep(kept, remove, parts.groups)
    staying = [kept[slot] for slot in slots]
    output = _shrink_projections(owner, parts, slots, shared)
    with torch.no_grad():
        for position, head in enumerate(staying):
            if head in remove:  # kept only as its group's filler, or as the last head of the layer
                output.weight[:, position * parts.head_dim : (position + 1) * parts.head_dim] = 0
    if parts.head_argument is not None and not hasattr(attention, KEPT_HEADS):
        hook_module(attention, _KeptHeadsOf(parts.head_argument), before=True)
    setattr(attention, KEPT_HEADS, staying)
    for name in ("num_attention_heads", "n_heads"):
        if hasattr(attention, name):
            setattr(attention, name, len(staying))
    if hasattr(attention, "num_key_value_groups"):
        attention.num_key_value_groups = len(slots) // len(shared)
    if hasattr(attention, "all_head_size"):
        attention.all_head_size = len(staying) * parts.head_dim


def check_prunable(model: PreTrainedModel) -> None:
    """Refuse a model whose heads :func:`prune_model` cannot remove.

    Raises:
        BertologyError: an ALBERT model, a model type bertology does not describe, or a GPT-2 (its
            projections are ``Conv1D``, which :func:`prune_model` does not rebuild).
    """
    if shares_layers(model):
        raise BertologyError(
            "ALBERT shares one set of attention weights between all layers, so a head cannot be removed "
            "from one layer alone; gate it instead (head_gates)."
        )
    if not all(isinstance(parts.output, nn.Linear) for parts in attention_parts(model)):
        raise BertologyError(
            f"Pruning rebuilds nn.Linear projections, and a {model.config.model_type!r} model's are Conv1D "
            "modules, so its heads can be gated or ablated but not removed (prune none of them)."
        )


def prune_model(model: PreTrainedModel, heads: HeadSelection) -> None:
    """Remove ``heads`` (original numbering; ones already removed are ignored) from ``model`` in place and
    record every removed head in its config.

    Raises:
        BertologyError: a model :func:`check_prunable` refuses, or a head outside the model.
    """
    check_prunable(model)
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
    with the saved weights (every weight must match: a pruned model keeps its own classifier; weights tied
    to others, such as a decoder's output embeddings, are saved once and tied again).

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
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})  # saved once, as their source
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"\n  missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    except RuntimeError as error:
        first = str(error).splitlines()[1].strip() if "\n" in str(error) else str(error)
        raise BertologyError(f"The weights in '{source}' do not fit its pruned config: {first}") from error
    if missing:
        model.tie_weights()
    return model
