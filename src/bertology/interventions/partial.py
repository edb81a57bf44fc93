"""Run a classifier from layer ``l`` on: keep the hidden states entering each layer from one clean pass,
then recompute only layers ``l..L-1`` and the classification head.

Removing head ``(l, h)`` leaves layers ``0..l-1`` as they were, so a sweep over every head needs each
batch's lower layers only once. The layers run are the model's own modules, called with the arguments
the clean pass gave them (the attention mask and, by type, rotary embeddings, relative positions or a
position bias), under head gates of their own (the model's gates from layer ``l`` on, so the first layer
run takes layer ``l``'s gates); the head (pooler, final norm, classifier) is the model's own forward with
every layer replaced, for that call, by a module that returns what the last layer returned (the hidden
states, or a tuple that starts with them). From layer 0 the whole model runs gated (nothing to reuse, and
what happens between the embeddings and the first layers, or after the first, stays the model's own:
DeBERTa-v2's convolution after layer 0). Both steps change the model's modules for the duration of one
call (a hook, a replaced ``forward``), so the model must not serve other threads meanwhile. The layers are
found through :mod:`bertology.models.anatomy`.

A causal decoder can run the later positions of a batch only, reading the keys and values of the
earlier ones from a transformers cache filled by one pass of those positions (:class:`Prefix`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache

from bertology.interventions.gates import gated
from bertology.models.anatomy import layer_modules
from bertology.models.loading import LoadedModel
from bertology.models.sites import hooking, skipping


@dataclass
class LayerInputs:
    """What one clean forward pass of a batch gave each layer.

    hidden: per layer, [batch, tokens, hidden] the hidden states entering it.
    extra_args, extra_kwargs: per layer, the other arguments of its call (the attention mask and so on).
    logits: [batch, labels] of the clean pass.
    """

    hidden: list[torch.Tensor]
    extra_args: list[tuple[Any, ...]]
    extra_kwargs: list[dict[str, Any]]
    logits: torch.Tensor

    def tiled(self, start: int, copies: int, cache: Cache | None = None) -> LayerInputs:
        """These inputs for ``copies`` copies of the batch side by side (:func:`tiled`): the hidden states
        entering layer ``start`` (the only ones :func:`logits_from_layer` reads from ``start``) and every
        layer's arguments, in which each key/value cache is replaced by ``cache`` when given."""
        batch = self.hidden[start].shape[0]
        hidden = list(self.hidden)
        hidden[start] = tiled(hidden[start], copies, batch)
        return replace(
            self,
            hidden=hidden,
            extra_args=tiled(self.extra_args, copies, batch, cache),
            extra_kwargs=tiled(self.extra_kwargs, copies, batch, cache),
        )


def tiled(value: Any, copies: int, batch: int, cache: Cache | None = None) -> Any:
    """``value`` with every tensor of two or more dimensions whose first is ``batch`` repeated ``copies``
    times along it (copy ``k``: rows ``k * batch .. (k + 1) * batch - 1``) and, when ``cache`` is given,
    every key/value cache replaced by it; in tuples, lists and dicts too."""
    if isinstance(value, torch.Tensor):
        if value.dim() >= 2 and value.shape[0] == batch:
            return value.repeat(copies, *([1] * (value.dim() - 1)))
        return value
    if isinstance(value, Cache):
        return value if cache is None else cache
    if isinstance(value, tuple | list):
        return type(value)(tiled(item, copies, batch, cache) for item in value)
    if isinstance(value, dict):
        return {key: tiled(item, copies, batch, cache) for key, item in value.items()}
    return value


def _distinct(modules: list[nn.Module]) -> list[nn.Module]:
    return list({id(module): module for module in modules}.values())


def record_layer_inputs(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> LayerInputs:
    """Run ``loaded`` (a classifier) once on ``inputs`` and keep what entered each layer."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def keep(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _output: None) -> None:
        calls.append((args, kwargs))

    modules = layer_modules(loaded.model)
    with hooking(before=[(module, keep) for module in _distinct(modules)]):
        logits = loaded.model(**inputs).logits
    if len(calls) != len(modules):
        raise RuntimeError(f"Expected {len(modules)} layer calls in one forward pass, saw {len(calls)}.")
    return LayerInputs(
        hidden=[args[0] for args, _ in calls],
        extra_args=[args[1:] for args, _ in calls],
        extra_kwargs=[kwargs for _, kwargs in calls],
        logits=logits,
    )


def _hidden_of(output: torch.Tensor | tuple[Any, ...]) -> torch.Tensor:
    """The hidden states a layer returned (alone, or first in a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def logits_from_layer(
    loaded: LoadedModel,
    inputs: dict[str, torch.Tensor],
    recorded: LayerInputs,
    start: int,
    gates: torch.Tensor,
    replacement: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """[batch, labels] logits of ``inputs`` with layers ``start..L-1`` recomputed from ``recorded``.

    gates: the whole model's head gates, ``[layers, heads]`` or ``[batch, layers, heads]`` (see
    :class:`~bertology.models.hook.HeadGates`); layers ``start..`` run with theirs. replacement: the whole
    model's, per layer (``None``: zero), layers ``start..`` run with theirs.
    """
    if start == 0:
        with gated(loaded, gates, replacement):
            return loaded.model(**inputs).logits
    modules = layer_modules(loaded.model)
    output: torch.Tensor | tuple[Any, ...] = recorded.hidden[start]
    later = None if replacement is None else replacement[start:]
    with gated(loaded, gates[..., start:, :], later):
        for index in range(start, len(modules)):
            hidden = _hidden_of(output)
            output = modules[index](hidden, *recorded.extra_args[index], **recorded.extra_kwargs[index])
    with skipping(loaded.model, dict.fromkeys(range(len(modules)), lambda _hidden: output)):
        return loaded.model(**inputs).logits


@dataclass
class Prefix:
    """A causal decoder's keys and values of the first ``length`` positions of a batch, every layer's, from
    one forward pass of those positions (a transformers ``Cache``: per layer [batch, key/value heads,
    length, head_dim]).

    In a causal decoder the activations at a position depend only on the tokens up to it, so these are the
    keys and values of those positions in a run of any inputs that begin with the same tokens.
    rows: [batch] the batch's row numbers. argument: the name of the model's (and its layers') cache
    argument (``cache``, or ``past_key_values`` in transformers versions before its renaming).
    """

    length: int
    rows: torch.Tensor
    cache: Cache
    argument: str

    def copy(self, copies: int = 1) -> Cache:
        """A new cache of ``copies`` copies of the batch side by side (copy ``k``: rows ``k * batch ..
        (k + 1) * batch - 1``), for one pass to grow (the layers append the later positions to a cache they
        are given); this one stays as it is."""
        fresh = copy.deepcopy(self.cache)
        fresh.batch_select_indices(self.rows.repeat(copies))
        return fresh

    def after(self, inputs: dict[str, Any], cache: Cache) -> dict[str, Any]:
        """``inputs`` of every position (``input_ids`` [batch, tokens], the attention mask of them all) for
        the positions after the prefix only, reading the prefix's keys and values from ``cache``."""
        later = inputs["input_ids"][:, self.length :]
        return {**inputs, "input_ids": later, self.argument: cache, "use_cache": True}


def run_prefix(loaded: LoadedModel, inputs: dict[str, torch.Tensor], length: int) -> Prefix | None:
    """The keys and values of the first ``length`` positions of ``inputs`` (a decoder's: ``input_ids``
    [batch, tokens] and an all-ones ``attention_mask``), from one forward pass of those positions; ``None``
    for a model whose forward takes no key/value cache (an encoder) or returns none."""
    if loaded.kind != "decoder":
        return None
    parameters = inspect.signature(loaded.model.forward).parameters
    argument = next((name for name in ("cache", "past_key_values") if name in parameters), None)
    if argument is None:
        return None
    ids = inputs["input_ids"]
    first = {
        **inputs,
        "input_ids": ids[:, :length],
        "attention_mask": inputs["attention_mask"][:, :length],
        "use_cache": True,
    }
    cache = getattr(loaded.model(**first), argument, None)
    if not isinstance(cache, Cache) or cache.get_seq_length() != length:
        return None
    return Prefix(length, torch.arange(ids.shape[0], device=ids.device), cache, argument)
