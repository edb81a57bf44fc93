"""Where a model keeps its layers and attention projections, found by the :class:`Layout` its type's
record in :data:`bertology.models.model_types.MODEL_TYPES` gives (the module paths and the row order of the
projections are explained there).

Head gates (:mod:`bertology.interventions.gates`, a hook on each layer's output projection), structural
pruning (:mod:`bertology.models.surgery`, which replaces projections), the ablation sweep
(:mod:`bertology.interventions.partial`, which runs layers one by one), the norm-based attention weights
(:mod:`bertology.attention.norms`, which read the value and output projections) and the named sites
(:mod:`bertology.models.sites`, every tensor of a forward pass) reach the modules only through this module;
:func:`describes` says which model types have a layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from bertology.errors import BertologyError
from bertology.models.model_types import MODEL_TYPES, Fused, Layout, Stacks

#: An encoder-decoder's three kinds of attention, in the order of its gate rows and of ``heads.csv``'s
#: ``stack`` column: the encoder's self-attention, the decoder's self-attention, cross-attention.
STACKS = ("encoder", "decoder", "cross")
#: One layer of one stack: ``("cross", 1)``.
StackLayer = tuple[str, int]


def describes(model_type: str) -> bool:
    """True when bertology knows the layers and attention projections of ``model_type`` models (the
    types that support head gates, ablation, importance, pruning and norm-based weights)."""
    entry = MODEL_TYPES.get(model_type)
    return entry is not None and entry.layout is not None


def described_types() -> tuple[str, ...]:
    """Every model type :func:`describes`, in table order."""
    return tuple(name for name in MODEL_TYPES if describes(name))


def layout(model: PreTrainedModel) -> Layout:
    """The layout of ``model``'s type.

    Raises:
        BertologyError: a type without a layout, or a variant whose heads are not separable.
    """
    config = model.config
    entry = MODEL_TYPES.get(config.model_type)
    if entry is not None and entry.stacks is not None:
        raise BertologyError(
            f"This works on encoders and decoders; a {config.model_type!r} model is an encoder-decoder, "
            "whose heads bertology gates, ablates and patches in its three stacks (ablate --lm-corpus with "
            "sources and targets, patch_target_loss)."
        )
    if entry is None or entry.layout is None:
        raise BertologyError(
            f"Interventions and norm-based weights are for models whose attention projections bertology "
            f"knows ({', '.join(described_types())}); a {config.model_type!r} model is not one of them."
        )
    if getattr(config, "talking_head", False):
        raise BertologyError(
            "This DeBERTa model mixes its heads' scores ('talking heads'), so no head can be gated, removed "
            "or weighed alone."
        )
    return entry.layout


def linear_weight(projection: nn.Module) -> torch.Tensor:
    """``projection``'s weight as ``nn.Linear`` keeps it, ``[out_features, in_features]``: an ``nn.Linear``'s
    own, or the transpose of a GPT-2 ``Conv1D``'s ``[in_features, out_features]`` (the same map,
    ``y = x W + b``)."""
    weight: torch.Tensor = projection.weight
    return weight.T if isinstance(projection, Conv1D) else weight


def _in_features(projection: nn.Module) -> int:
    """Input features of an ``nn.Linear`` or a ``Conv1D`` (its ``nx``)."""
    return int(projection.nx if isinstance(projection, Conv1D) else projection.in_features)


@dataclass(frozen=True)
class Projection:
    """Per-head features computed by ``linear`` (an ``nn.Linear``, or GPT-2's ``Conv1D``, which stores its
    weight transposed: read it with :func:`linear_weight`): head slot ``s`` (0-based among the heads the
    layer has) owns ``head_dim`` output rows (output features) from ``first + s * step``.

    bias: name of a separate ``[heads * head_dim]`` parameter of the attention module added to the
    features (DeBERTa's ``q_bias`` / ``v_bias``), or ``None``.
    """

    linear: nn.Module
    first: int
    step: int
    bias: str | None = None

    def rows(self, slots: list[int], head_dim: int) -> list[int]:
        """Output rows of ``linear`` that hold the features of head ``slots``, in slot order."""
        return [self.first + slot * self.step + offset for slot in slots for offset in range(head_dim)]


@dataclass(frozen=True)
class AttentionParts:
    """One layer's self-attention.

    module: the self-attention module (holds the head count that pruning updates).
    query: :class:`Projection` from the hidden size to ``heads * head_dim`` features; key, value: to
        ``heads / groups * head_dim`` features (one block per key/value head).
    output: the projection from ``heads * head_dim`` features back to the hidden size (an ``nn.Linear``
        or GPT-2's ``Conv1D``; its input is the heads' outputs side by side either way).
    head_dim: features per head. heads: query heads the layer has now (fewer once pruned).
    per_head: further projections with ``head_dim`` rows per head (see :class:`Layout`).
    head_argument: see :class:`Layout`.
    groups: query heads per key/value head (grouped-query attention; 1 without): query slot ``s`` reads
        key/value slot ``s // groups``, as transformers' ``repeat_kv``.
    """

    module: nn.Module
    query: Projection
    key: Projection
    value: Projection
    output: nn.Module
    head_dim: int
    heads: int
    per_head: tuple[Projection, ...] = ()
    head_argument: int | None = None
    groups: int = 1

    def output_weight(self) -> torch.Tensor:
        """[hidden, heads * head_dim] the output projection's weight (head ``h`` owns columns
        ``h * head_dim .. (h + 1) * head_dim``)."""
        return linear_weight(self.output)

    @property
    def key_value_heads(self) -> int:
        """Key/value heads the layer has now."""
        return self.heads // self.groups

    def value_vectors(self, projected: torch.Tensor) -> torch.Tensor:
        """[batch, key_value_heads, tokens, head_dim] value vectors from the value ``Linear``'s output
        ``projected`` [batch, tokens, out_features] (its separate bias added)."""
        slots = list(range(self.key_value_heads))
        rows = torch.tensor(self.value.rows(slots, self.head_dim), device=projected.device)
        values = projected.index_select(-1, rows)
        if self.value.bias is not None:
            values = values + getattr(self.module, self.value.bias)
        return values.unflatten(-1, (self.key_value_heads, self.head_dim)).transpose(1, 2)


def shares_layers(model: PreTrainedModel) -> bool:
    """True for ALBERT, whose layers share one set of weights (a group of layers)."""
    return model.config.model_type == "albert"


def _config_layers(model: PreTrainedModel) -> int:
    config = model.config
    return int(getattr(config, "num_hidden_layers", None) or config.n_layers)


def layer_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The module called once per layer, in layer order; its first argument is the hidden states
    ``[batch, tokens, hidden]``, its result those hidden states or a tuple that starts with them.
    ALBERT's list repeats its shared layer groups.

    Raises:
        BertologyError: an undescribed type, or an ALBERT with more than one layer per group.
    """
    shape = layout(model)
    modules = list(model.base_model.get_submodule(shape.layers))
    if not shares_layers(model):
        return modules
    if model.config.inner_group_num != 1:
        raise BertologyError("bertology supports ALBERT models with one layer per group (inner_group_num=1).")
    layers = _config_layers(model)
    return [modules[int(index / (layers / len(modules)))] for index in range(layers)]


def _head_dim(attention: nn.Module) -> int:
    for name in ("attention_head_size", "head_dim", "key_value_proj_dim"):  # T5: key_value_proj_dim
        if getattr(attention, name, None):
            return int(getattr(attention, name))
    raise AttributeError(f"{type(attention).__name__} has no head size")


def _qkv(layer: nn.Module, spec: tuple[str, str, str] | Fused, heads: int, head_dim: int) -> list[Projection]:
    if not isinstance(spec, Fused):
        return [Projection(layer.get_submodule(path), 0, head_dim) for path in spec]
    linear = layer.get_submodule(spec.path)
    first, step = (heads * head_dim, head_dim) if spec.order == "stacked" else (head_dim, 3 * head_dim)
    return [Projection(linear, index * first, step, spec.biases[index]) for index in range(3)]


def _parts(layer: nn.Module, layout: Layout) -> AttentionParts:
    attention = layer.get_submodule(layout.attention)
    output = layer.get_submodule(layout.output)
    head_dim = _head_dim(attention)
    heads = _in_features(output) // head_dim
    query, key, value = _qkv(layer, layout.qkv, heads, head_dim)
    per_head = tuple(
        Projection(layer.get_submodule(path), 0, head_dim)
        for path in layout.per_head
        if has_submodule(layer, path)
    )
    groups = int(getattr(attention, "num_key_value_groups", 1))
    return AttentionParts(
        attention, query, key, value, output, head_dim, heads, per_head, layout.head_argument, groups
    )


def has_submodule(module: nn.Module, path: str) -> bool:
    """Whether ``module`` has a submodule at ``path`` (dotted, as ``get_submodule`` reads it)."""
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def attention_parts(model: PreTrainedModel) -> list[AttentionParts]:
    """Each layer's :class:`AttentionParts`, in layer order (ALBERT: the shared parts, repeated).

    Raises:
        BertologyError: a model type this module does not describe (see :func:`describes`).
    """
    shape = layout(model)
    return [_parts(layer, shape) for layer in layer_modules(model)]


# --- Encoder-decoders: three attentions, each a stack of layers -------------------------------------------


def stacks(model: PreTrainedModel) -> Stacks:
    """The :class:`~bertology.models.model_types.Stacks` of an encoder-decoder ``model``.

    Raises:
        BertologyError: a model that is not an encoder-decoder bertology describes.
    """
    entry = MODEL_TYPES.get(model.config.model_type)
    if entry is None or entry.stacks is None:
        raise BertologyError(f"A {model.config.model_type!r} model has no encoder, decoder and cross stacks.")
    return entry.stacks


def has_stacks(model: PreTrainedModel) -> bool:
    """True for an encoder-decoder with :func:`stacks` (BART, T5)."""
    entry = MODEL_TYPES.get(model.config.model_type)
    return entry is not None and entry.stacks is not None


def _stack_layout(model: PreTrainedModel, stack: str) -> Layout:
    if stack not in STACKS:
        raise BertologyError(f"There is no stack {stack!r}; the stacks are {', '.join(STACKS)}.")
    return getattr(stacks(model), stack)


def stack_layer_modules(model: PreTrainedModel, stack: str) -> list[nn.Module]:
    """The layer modules of ``stack`` (``"cross"``: the decoder's layers, which hold cross-attention), in
    layer order."""
    return list(model.base_model.get_submodule(_stack_layout(model, stack).layers))


def stack_parts(model: PreTrainedModel, stack: str) -> list[AttentionParts]:
    """Each layer's :class:`AttentionParts` of ``stack``'s attention (cross-attention's key and value
    projections read the encoder's output)."""
    shape = _stack_layout(model, stack)
    return [_parts(layer, shape) for layer in stack_layer_modules(model, stack)]


def gate_rows(model: PreTrainedModel) -> list[StackLayer]:
    """The layers an encoder-decoder's heads are gated in, as rows of its gates ``[rows, heads]``: the
    encoder's layers, then the decoder's (self-attention), then the decoder's again (cross-attention)."""
    return [(stack, layer) for stack in STACKS for layer in range(len(stack_layer_modules(model, stack)))]


def gated_parts(model: PreTrainedModel) -> list[AttentionParts]:
    """The attention of every gate row: each layer's, or an encoder-decoder's by :func:`gate_rows`."""
    if not has_stacks(model):
        return attention_parts(model)
    return [part for stack in STACKS for part in stack_parts(model, stack)]


def attention_calls(model: PreTrainedModel) -> list[StackLayer]:
    """The attention calls of one forward pass of an encoder-decoder (a source and a target, teacher
    forced), in the order it makes them: every encoder layer, then per decoder layer its self-attention
    and its cross-attention."""
    encoder, decoder = (len(stack_layer_modules(model, stack)) for stack in ("encoder", "decoder"))
    return [("encoder", layer) for layer in range(encoder)] + [
        (stack, layer) for layer in range(decoder) for stack in ("decoder", "cross")
    ]
