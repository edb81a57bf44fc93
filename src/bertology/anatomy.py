"""Where each supported architecture keeps its layers and its attention projections.

Structural pruning (:mod:`bertology.surgery`, which replaces projections), the ablation sweep
(:mod:`bertology.interventions.partial`, which runs layers one by one) and the norm-based attention
weights (:mod:`bertology.norms`, which read each layer's output projection) know the modules by name
only through this module. Every ``nn.Linear`` stores its weight as ``[out_features, in_features]``:
the query, key and value projections output
``heads * head_dim`` features (head ``h`` owns rows ``h * head_dim .. (h + 1) * head_dim``), and the
output projection takes them as input (head ``h`` owns the same range of columns).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from transformers import PreTrainedModel

from bertology.errors import BertologyError

#: Architectures whose layers sit in ``encoder.layer`` with ``attention.self`` / ``attention.output``.
_BERT_LIKE = {"bert", "roberta", "xlm-roberta", "electra"}


@dataclass(frozen=True)
class AttentionParts:
    """One layer's self-attention.

    module: the module handed to the attention function (it holds the head count).
    query, key, value: projections from the hidden size to ``heads * head_dim`` features.
    output: the projection from ``heads * head_dim`` features back to the hidden size.
    head_dim: features per head.
    """

    module: nn.Module
    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    output: nn.Linear
    head_dim: int


def _config_layers(model: PreTrainedModel) -> int:
    config = model.config
    return int(getattr(config, "num_hidden_layers", None) or config.n_layers)


def shares_layers(model: PreTrainedModel) -> bool:
    """True for ALBERT, whose layers share one set of weights (a group of layers)."""
    return model.config.model_type == "albert"


def layer_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The module called once per layer, in layer order; its first argument and its result are the hidden
    states ``[batch, tokens, hidden]``. ALBERT's list repeats its shared layer groups.

    Raises:
        BertologyError: an ALBERT with more than one layer per group (several attention calls per layer).
    """
    base = model.base_model
    model_type = model.config.model_type
    if model_type in _BERT_LIKE:
        return list(base.encoder.layer)
    if model_type == "distilbert":
        return list(base.transformer.layer)
    if model_type == "albert":
        if model.config.inner_group_num != 1:
            raise BertologyError(
                "bertology supports ALBERT models with one layer per group (inner_group_num=1)."
            )
        groups = base.encoder.albert_layer_groups
        layers = _config_layers(model)
        return [groups[int(index / (layers / len(groups)))] for index in range(layers)]
    raise BertologyError(f"Interventions do not know the layers of a {model_type!r} model.")


#: Per architecture: the path from a layer module to its attention module, then the names of the query,
#: key, value and output projections (dotted paths from the layer module).
_ATTENTION_PATHS: dict[str, tuple[str, str, str, str, str]] = {
    **{
        name: ("attention.self", "attention.self.query", "attention.self.key", "attention.self.value",
               "attention.output.dense")
        for name in _BERT_LIKE
    },
    "distilbert": ("attention", "attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"),
    "albert": (
        "albert_layers.0.attention", "albert_layers.0.attention.query", "albert_layers.0.attention.key",
        "albert_layers.0.attention.value", "albert_layers.0.attention.dense",
    ),
}  # fmt: skip


def attention_parts(model: PreTrainedModel) -> list[AttentionParts]:
    """Each layer's :class:`AttentionParts`, in layer order (ALBERT: the shared parts, repeated).

    Raises:
        BertologyError: a model outside the BERT family, whose projections this module does not know.
    """
    paths = _ATTENTION_PATHS.get(model.config.model_type)
    if paths is None:
        raise BertologyError(
            f"bertology knows the attention projections of BERT-family encoders only, not of a "
            f"{model.config.model_type!r} model (needed for norm-based weights and interventions)."
        )
    parts = []
    for layer in layer_modules(model):
        attention, query, key, value, output = (layer.get_submodule(path) for path in paths)
        parts.append(AttentionParts(attention, query, key, value, output, attention.attention_head_size))
    return parts
