"""The second capture route: models that compute attention in their own code.

transformers 5 sends most models' attention through its ``AttentionInterface``, where
:mod:`bertology.models.hook` records it. DeBERTa, MPNet, Megatron-BERT and RoFormer compute their attention
in their own self-attention modules instead, and each such module returns its probabilities as the
second element of its output (``(context, probs)``) when it is asked for them with
``output_attentions=True``, which the model's own ``output_attentions=True`` then collects.

Here every one of those modules gets two hooks. While a :class:`~bertology.models.hook.Recorder` is active in
the current context, a forward pre-hook asks that one module for its probabilities (its own
``output_attentions`` argument, whether passed by keyword or by position), and a forward hook hands them
to the recorder exactly as the attention function does for the first route, one call per layer in layer
order. So the numbers are the model's own (no re-derivation), nothing is added to the model's output
(it is not asked for ``output_attentions``, so no layer's probabilities outlive the next layer: the
streaming consumers keep flat memory), and ``stop_after`` ends the pass after the last layer's
attention. Outside a recording the hooks return at once.

Queries and keys (for the neuron view) are taken only where ``softmax(q·k * scaling + mask)`` is the
whole computation: :attr:`~bertology.models.model_types.ModuleRoute.queries_keys` names the recipe
(:data:`QUERIES_KEYS`) that recomputes them from the module's own projections (and, for RoFormer, its own
rotary embedding) on the module's inputs, only when they are asked for.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from bertology.models.hook import active_recorder
from bertology.models.model_types import ModuleRoute, QueriesKeysName
from bertology.models.sites import hook_module

#: ``queries_keys(module, inputs)`` -> (query, key, scaling): query and key ``[batch, heads, tokens,
#: head_dim]`` as the module's q·k takes them, from ``inputs``, the module's forward arguments by name.
QueriesKeys = Callable[[nn.Module, Mapping[str, Any]], tuple[torch.Tensor, torch.Tensor, float]]


def _split_heads(states: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``[batch, tokens, heads * head_dim]`` -> ``[batch, heads, tokens, head_dim]``."""
    return states.view(*states.shape[:-1], -1, head_dim).transpose(1, 2)


def bert_style_queries_keys(
    module: nn.Module, inputs: Mapping[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Megatron-BERT's ``query`` and ``key`` projections of ``hidden_states``; scores are scaled by
    ``1 / sqrt(head_dim)``."""
    head_dim = module.attention_head_size
    hidden = inputs["hidden_states"]
    query = _split_heads(module.query(hidden), head_dim)
    key = _split_heads(module.key(hidden), head_dim)
    return query, key, 1.0 / math.sqrt(head_dim)


def rotary_queries_keys(
    module: nn.Module, inputs: Mapping[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """RoFormer's queries and keys after its rotary position embedding (the module's own
    ``apply_rotary_position_embeddings``), so q·k already holds the relative positions."""
    query, key, scaling = bert_style_queries_keys(module, inputs)
    sinusoidal = inputs.get("sinusoidal_pos")
    if sinusoidal is not None:
        query, key = module.apply_rotary_position_embeddings(sinusoidal, query, key)
    return query, key, scaling


#: The recipes a :class:`~bertology.models.model_types.ModuleRoute` names, by name.
QUERIES_KEYS: dict[QueriesKeysName, QueriesKeys] = {
    "bert_style": bert_style_queries_keys,
    "rotary": rotary_queries_keys,
}


#: Attribute set on a model once its attention modules carry the hooks of :func:`hook_attention_modules`.
_MODULES_HOOKED = "bertology_modules_hooked"


def hook_attention_modules(model: PreTrainedModel, route: ModuleRoute) -> int:
    """Put the recording hooks on every ``route.attention_class`` module of ``model`` (once per model);
    returns how many modules carry them.

    Raises:
        ValueError: ``model`` has no such module (a table entry that does not fit the model).
    """
    modules = [module for module in model.modules() if type(module).__name__ == route.attention_class]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no {route.attention_class} module.")
    if getattr(model, _MODULES_HOOKED, False):
        return len(modules)
    recipe = None if route.queries_keys is None else QUERIES_KEYS[route.queries_keys]
    for module in modules:
        parameters = list(inspect.signature(module.forward).parameters)
        hook_module(module, _AskForProbs(parameters.index("output_attentions")), before=True)
        hook_module(module, _RecordProbs(recipe, parameters))
    setattr(model, _MODULES_HOOKED, True)
    return len(modules)


class _AskForProbs:
    """Forward pre-hook: while recording, call the module with ``output_attentions=True`` (at
    ``position`` when passed positionally, else as a keyword)."""

    def __init__(self, position: int) -> None:
        self.position = position

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _: None
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if active_recorder() is None:
            return None
        if len(args) > self.position:
            args = (*args[: self.position], True, *args[self.position + 1 :])
        else:
            kwargs = {**kwargs, "output_attentions": True}
        return args, kwargs


class _RecordProbs:
    """Forward hook: hand the module's probabilities (its output's second element) to the active
    recorder, with the queries and keys when the recorder keeps them."""

    def __init__(self, queries_keys: QueriesKeys | None, parameters: list[str]) -> None:
        self.queries_keys = queries_keys
        self.parameters = parameters

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: tuple[Any, ...]
    ) -> None:
        recorder = active_recorder()
        if recorder is None:
            return
        query = key = None
        scaling = math.nan
        if recorder.keep_qk and self.queries_keys is not None:
            inputs = {**dict(zip(self.parameters, args, strict=False)), **kwargs}
            query, key, scaling = self.queries_keys(module, inputs)
        recorder.record(output[1], query, key, None, scaling)
