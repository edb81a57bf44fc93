"""Where each encoder type keeps its layers and its attention projections: one table, :data:`_LAYOUTS`.

Head gates (:mod:`bertology.interventions.gates`, a hook on each layer's output projection), structural
pruning (:mod:`bertology.surgery`, which replaces projections), the ablation sweep
(:mod:`bertology.interventions.partial`, which runs layers one by one) and the norm-based attention
weights (:mod:`bertology.norms`, which read the value and output projections) know the modules by name
only through this module; :func:`describes` says which model types it knows.

Every ``nn.Linear`` stores its weight as ``[out_features, in_features]``. A layer's query, key and value
features are ``head_dim`` output rows per head of a projection (:class:`Projection`): their own ``Linear``
(head ``h`` owns rows ``h * head_dim .. (h + 1) * head_dim``), or one fused ``Linear`` with q, k and v
stacked (ModernBERT's ``Wqkv``: all heads' q rows, then k, then v) or interleaved per head (DeBERTa's
``in_proj``: head ``h``'s q, k and v rows together). The output projection takes the heads' outputs,
concatenated, as input: head ``h`` owns columns ``h * head_dim .. (h + 1) * head_dim``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel

from bertology.errors import BertologyError

#: How a fused projection orders its rows: ``"stacked"`` (q of every head, then k, then v) or
#: ``"interleaved"`` (q, k, v of head 0, then of head 1, ...).
FusedOrder = Literal["stacked", "interleaved"]


@dataclass(frozen=True)
class _Fused:
    """One ``Linear`` computing q, k and v (path from the layer), in ``order``; ``biases``: names of
    separate ``[heads * head_dim]`` parameters of the attention module added to q, k, v (or ``None``)."""

    path: str
    order: FusedOrder
    biases: tuple[str | None, str | None, str | None] = (None, None, None)


@dataclass(frozen=True)
class _Layout:
    """One encoder type's modules, as paths.

    layers: from the base model to the ``ModuleList`` of layers.
    attention: from a layer to its self-attention module (holds the head size; its head count is kept
        up to date by pruning). qkv: from a layer to the query, key and value ``Linear``\\ s, or one
        fused one. output: from a layer to the output projection.
    per_head: from a layer to further projections with ``head_dim`` rows per head, present or not
        depending on the config (DeBERTa's relative-position projections); pruning slices them too.
    head_argument: index of a positional argument of the attention module holding per-head values
        ``[batch, heads, query, key]`` computed once for all layers (MPNet's relative position bias).
    """

    layers: str
    attention: str
    qkv: tuple[str, str, str] | _Fused
    output: str
    per_head: tuple[str, ...] = ()
    head_argument: int | None = None


def _separate(attention: str, names: tuple[str, str, str]) -> tuple[str, str, str]:
    """Paths of the query, key and value ``Linear``\\ s named ``names`` inside ``attention``."""
    query, key, value = (f"{attention}.{name}" for name in names)
    return query, key, value


def _projections_layout(attention: str, names: tuple[str, str, str, str], layers: str = "layers") -> _Layout:
    """The layout of a type whose four projections are children ``names`` of its attention module."""
    query, key, value, output = names
    return _Layout(layers, attention, _separate(attention, (query, key, value)), f"{attention}.{output}")


_QUERY_KEY_VALUE = ("query", "key", "value")
#: BERT's layout: ``encoder.layer[i].attention.self.{query,key,value}`` and ``.attention.output.dense``.
_BERT = _Layout(
    "encoder.layer", "attention.self", _separate("attention.self", _QUERY_KEY_VALUE), "attention.output.dense"
)
#: Encoders with BERT's layout.
BERT_LAYOUT_TYPES = (
    "bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie", "data2vec-text", "xmod", "roc_bert",
    "xlm-roberta-xl", "megatron-bert", "roformer", "mobilebert",
)  # fmt: skip

#: Every encoder type this module describes, with its layout (ALBERT's layers: see :func:`layer_modules`).
_LAYOUTS: dict[str, _Layout] = {
    **{model_type: _BERT for model_type in BERT_LAYOUT_TYPES},
    "distilbert": _projections_layout(
        "attention", ("q_lin", "k_lin", "v_lin", "out_lin"), layers="transformer.layer"
    ),
    "albert": _Layout(
        "encoder.albert_layer_groups", "albert_layers.0.attention",
        _separate("albert_layers.0.attention", _QUERY_KEY_VALUE), "albert_layers.0.attention.dense",
    ),
    "modernbert": _Layout("layers", "attn", _Fused("attn.Wqkv", "stacked"), "attn.Wo"),
    "gte": _projections_layout("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
    "nomic_bert": _projections_layout("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
    "deberta": _Layout(
        "encoder.layer", "attention.self",
        _Fused("attention.self.in_proj", "interleaved", biases=("q_bias", None, "v_bias")),
        "attention.output.dense", per_head=("attention.self.pos_proj", "attention.self.pos_q_proj"),
    ),
    "deberta-v2": _Layout(
        "encoder.layer", "attention.self",
        _separate("attention.self", ("query_proj", "key_proj", "value_proj")),
        "attention.output.dense", per_head=("attention.self.pos_key_proj", "attention.self.pos_query_proj"),
    ),
    "mpnet": _Layout(
        "encoder.layer", "attention.attn", _separate("attention.attn", ("q", "k", "v")), "attention.attn.o",
        head_argument=2,
    ),
}  # fmt: skip


def describes(model_type: str) -> bool:
    """True when bertology knows the layers and attention projections of ``model_type`` models (the
    types that support head gates, ablation, importance, pruning and norm-based weights)."""
    return model_type in _LAYOUTS


def described_types() -> tuple[str, ...]:
    """Every model type :func:`describes`, in table order."""
    return tuple(_LAYOUTS)


def _layout(model: PreTrainedModel) -> _Layout:
    """The layout of ``model``'s type.

    Raises:
        BertologyError: a type this module does not describe, or a variant whose heads are not separable.
    """
    config = model.config
    layout = _LAYOUTS.get(config.model_type)
    if layout is None:
        raise BertologyError(
            f"Interventions and norm-based weights are for encoders whose attention projections bertology "
            f"knows ({', '.join(_LAYOUTS)}); a {config.model_type!r} model is not one of them."
        )
    if getattr(config, "talking_head", False):
        raise BertologyError(
            "This DeBERTa model mixes its heads' scores ('talking heads'), so no head can be gated, removed "
            "or weighed alone."
        )
    return layout


@dataclass(frozen=True)
class Projection:
    """Per-head features computed by ``linear``: head slot ``s`` (0-based among the heads the layer has)
    owns ``head_dim`` output rows from ``first + s * step``.

    bias: name of a separate ``[heads * head_dim]`` parameter of the attention module added to the
    features (DeBERTa's ``q_bias`` / ``v_bias``), or ``None``.
    """

    linear: nn.Linear
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
    query, key, value: :class:`Projection` from the hidden size to ``heads * head_dim`` features.
    output: the projection from ``heads * head_dim`` features back to the hidden size.
    head_dim: features per head. heads: heads the layer has now (fewer once pruned).
    per_head: further projections with ``head_dim`` rows per head (see :class:`_Layout`).
    head_argument: see :class:`_Layout`.
    """

    module: nn.Module
    query: Projection
    key: Projection
    value: Projection
    output: nn.Linear
    head_dim: int
    heads: int
    per_head: tuple[Projection, ...] = ()
    head_argument: int | None = None

    def value_vectors(self, projected: torch.Tensor) -> torch.Tensor:
        """[batch, heads, tokens, head_dim] value vectors from the value ``Linear``'s output ``projected``
        [batch, tokens, out_features] (its separate bias added)."""
        rows = torch.tensor(self.value.rows(list(range(self.heads)), self.head_dim), device=projected.device)
        values = projected.index_select(-1, rows)
        if self.value.bias is not None:
            values = values + getattr(self.module, self.value.bias)
        return values.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)


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
    layout = _layout(model)
    modules = list(model.base_model.get_submodule(layout.layers))
    if not shares_layers(model):
        return modules
    if model.config.inner_group_num != 1:
        raise BertologyError("bertology supports ALBERT models with one layer per group (inner_group_num=1).")
    layers = _config_layers(model)
    return [modules[int(index / (layers / len(modules)))] for index in range(layers)]


def _head_dim(attention: nn.Module) -> int:
    return int(getattr(attention, "attention_head_size", None) or attention.head_dim)


def _qkv(
    layer: nn.Module, spec: tuple[str, str, str] | _Fused, heads: int, head_dim: int
) -> list[Projection]:
    if not isinstance(spec, _Fused):
        return [Projection(layer.get_submodule(path), 0, head_dim) for path in spec]
    linear = layer.get_submodule(spec.path)
    first, step = (heads * head_dim, head_dim) if spec.order == "stacked" else (head_dim, 3 * head_dim)
    return [Projection(linear, index * first, step, spec.biases[index]) for index in range(3)]


def _parts(layer: nn.Module, layout: _Layout) -> AttentionParts:
    attention = layer.get_submodule(layout.attention)
    output = layer.get_submodule(layout.output)
    head_dim = _head_dim(attention)
    heads = output.in_features // head_dim
    query, key, value = _qkv(layer, layout.qkv, heads, head_dim)
    per_head = tuple(
        Projection(layer.get_submodule(path), 0, head_dim)
        for path in layout.per_head
        if _has_submodule(layer, path)
    )
    return AttentionParts(
        attention, query, key, value, output, head_dim, heads, per_head, layout.head_argument
    )


def _has_submodule(module: nn.Module, path: str) -> bool:
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
    layout = _layout(model)
    return [_parts(layer, layout) for layer in layer_modules(model)]
