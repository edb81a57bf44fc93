"""Named sites of a model's forward pass, and the two context managers that read and replace them.

A *site* is one tensor the forward pass computes, named as TransformerLens names its hooks (the README's
"Sites" table gives each one's TransformerLens name). :data:`SITES` states each site's axes; where each
model type computes it is found through :mod:`bertology.models.anatomy` (the type's
:class:`~bertology.models.model_types.Layout`). A site is asked for by name (every layer) or as
``(name, layer)``.

:func:`recording` keeps the requested sites' tensors of every forward pass made inside it (a
:class:`Cache`); :func:`replacing` puts a function's result in a site's place; :func:`trace` runs a model
once and returns the cache, as TransformerLens's ``run_with_cache``. Per-head sites (``q``, ``k``, ``v``,
``z``) are ``[batch, pos, head, d_head]``; with grouped-query attention ``k`` and ``v`` have one head per
key/value head, or, recorded with ``ungroup=True``, one copy per query head (as ``repeat_kv`` makes them).

ALBERT shares one layer between all its layers: a shared module's hook counts its calls in each forward
pass (the count starts again whenever the model's base model starts a pass), so call ``i`` is layer ``i``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from transformers import PreTrainedModel

from bertology.errors import BertologyError
from bertology.models import hook
from bertology.models.anatomy import (
    AttentionParts,
    Projection,
    attention_parts,
    layer_modules,
    layout,
    linear_weight,
    shares_layers,
)

SiteName = Literal[
    "embed",
    "resid_pre",
    "q",
    "k",
    "v",
    "pattern",
    "z",
    "attn_out",
    "resid_mid",
    "mlp_out",
    "resid_post",
    "final",
    "logits",
]


@dataclass(frozen=True)
class Site:
    """One named site: ``axes`` of its tensor, whether it has one tensor per layer, and the name of the
    TransformerLens hook with the same meaning (``{l}`` the layer)."""

    name: SiteName
    axes: tuple[str, ...]
    per_layer: bool
    transformer_lens: str
    meaning: str


#: Every site, in the order a forward pass computes them.
SITES: dict[str, Site] = {
    site.name: site
    for site in (
        Site("embed", ("batch", "pos", "d_embed"), False, "hook_embed", "the token embeddings"),
        Site("resid_pre", ("batch", "pos", "d_model"), True, "blocks.{l}.hook_resid_pre", "a layer's input"),
        Site("q", ("batch", "pos", "head", "d_head"), True, "blocks.{l}.attn.hook_q", "queries"),
        Site("k", ("batch", "pos", "head", "d_head"), True, "blocks.{l}.attn.hook_k", "keys"),
        Site("v", ("batch", "pos", "head", "d_head"), True, "blocks.{l}.attn.hook_v", "values"),
        Site(
            "pattern", ("batch", "head", "query_pos", "key_pos"), True, "blocks.{l}.attn.hook_pattern",
            "attention weights",
        ),
        Site(
            "z", ("batch", "pos", "head", "d_head"), True, "blocks.{l}.attn.hook_z",
            "each head's output, the input of the output projection (where head gates act)",
        ),
        Site(
            "attn_out", ("batch", "pos", "d_model"), True, "blocks.{l}.hook_attn_out",
            "what the attention block adds to the residual stream",
        ),
        Site(
            "resid_mid", ("batch", "pos", "d_model"), True, "blocks.{l}.hook_resid_mid",
            "the residual stream between the attention and feed-forward blocks",
        ),
        Site(
            "mlp_out", ("batch", "pos", "d_model"), True, "blocks.{l}.hook_mlp_out",
            "what the feed-forward block adds to the residual stream",
        ),
        Site(
            "resid_post", ("batch", "pos", "d_model"), True, "blocks.{l}.hook_resid_post", "a layer's output"
        ),
        Site(
            "final", ("batch", "pos", "d_model"), False, "ln_final.hook_normalized",
            "the base model's last hidden states (after a final norm where the model has one)",
        ),
        Site("logits", ("batch", "pos", "vocab"), False, "(the model's output)", "a head's logits"),
    )
}  # fmt: skip

#: Sites that exist to be replaced, not recorded: the input of one node of a circuit's graph
#: (:mod:`bertology.interventions.circuit_graph`), as TransformerLens computes them with
#: ``use_split_qkv_input``. Replacing ``q_input`` gives each head its own copy of the layer's input
#: ``[batch, pos, head, d_model]`` (before the norm a pre-norm model applies), from which its queries are
#: computed again (``k_input`` and ``v_input``: per key/value head); ``mlp_in`` is what enters the
#: feed-forward block (before its norm), changed for that block only, not in the residual stream.
NODE_INPUTS: dict[str, Site] = {
    site.name: site
    for site in (
        Site("q_input", ("batch", "pos", "head", "d_model"), True, "blocks.{l}.hook_q_input",  # type: ignore[arg-type]
             "each head's own copy of the layer's input, for its queries"),
        Site("k_input", ("batch", "pos", "head", "d_model"), True, "blocks.{l}.hook_k_input",  # type: ignore[arg-type]
             "each key/value head's own copy of the layer's input, for its keys"),
        Site("v_input", ("batch", "pos", "head", "d_model"), True, "blocks.{l}.hook_v_input",  # type: ignore[arg-type]
             "each key/value head's own copy of the layer's input, for its values"),
        Site("mlp_in", ("batch", "pos", "d_model"), True, "blocks.{l}.hook_mlp_in",  # type: ignore[arg-type]
             "the feed-forward block's own input, before its norm (pre-norm models)"),
    )
}  # fmt: skip

_PER_HEAD_INPUTS = ("q_input", "k_input", "v_input")

#: ``"z"`` (every layer), ``("z", 3)`` (layer 3) or ``("final", None)``.
SiteRequest = str | tuple[str, int | None]
#: A site of one layer (``None`` for the sites that are not per layer).
SiteKey = tuple[str, int | None]


def _keys(model: PreTrainedModel, requests: Iterable[SiteRequest]) -> list[SiteKey]:
    """The ``(name, layer)`` of every site ``requests`` names, in request order.

    Raises:
        BertologyError: an unknown site name or a layer the model does not have.
    """
    layers = len(layer_modules(model))
    keys: list[SiteKey] = []
    for request in requests:
        name, layer = (request, None) if isinstance(request, str) else request
        site = SITES.get(name) or NODE_INPUTS.get(name)
        if site is None:
            raise BertologyError(f"There is no site {name!r}; the sites are {', '.join(SITES)}.")
        if not site.per_layer:
            keys.append((name, None))
        elif layer is None:
            keys.extend((name, index) for index in range(layers))
        elif not 0 <= layer < layers:
            raise BertologyError(f"Site {name!r} has layers 0 to {layers - 1}; layer {layer} was asked for.")
        else:
            keys.append((name, layer))
    return keys


class Cache(dict[SiteKey, torch.Tensor]):
    """Recorded tensors keyed by ``(site name, layer)`` (``layer`` ``None`` for ``embed``, ``final`` and
    ``logits``); ``cache["embed"]`` reads a site without layers. Shapes: :data:`SITES`."""

    def __getitem__(self, key: SiteKey | str) -> torch.Tensor:
        return super().__getitem__((key, None) if isinstance(key, str) else key)

    def stack(self, name: str) -> torch.Tensor:
        """Every recorded layer of site ``name`` stacked on a new first axis, ``[layer, *axes]``."""
        return torch.stack([self[key] for key in sorted(k for k in self if k[0] == name)])


# --- Where each site is: a module, its input or output, and which part of it ----------------------------


@dataclass(frozen=True)
class _Spot:
    """A site's tensor in one module call: the module's first input (``"hidden_states"`` when passed by
    keyword) or its output (``field``: an index into a tuple output, or an attribute of a ``ModelOutput``);
    ``take`` and ``put`` turn that whole tensor into the site's tensor and back."""

    module: nn.Module
    is_input: bool
    field: int | str = 0
    take: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor
    put: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lambda _whole, part: part


def _heads(projection: Projection, heads: int, head_dim: int, module: nn.Module) -> tuple[Callable, Callable]:
    """``take`` and ``put`` of a per-head site computed by ``projection`` (its own bias parameter of
    ``module`` added, as DeBERTa's ``q_bias``)."""
    rows = projection.rows(list(range(heads)), head_dim)

    def bias(like: torch.Tensor) -> torch.Tensor | int:
        return 0 if projection.bias is None else getattr(module, projection.bias).to(like.dtype)

    def take(whole: torch.Tensor) -> torch.Tensor:
        index = torch.tensor(rows, device=whole.device)
        return (whole.index_select(-1, index) + bias(whole)).unflatten(-1, (heads, head_dim))

    def put(whole: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        index = torch.tensor(rows, device=whole.device)
        return whole.index_copy(-1, index, part.flatten(-2).to(whole.dtype) - bias(whole))

    return take, put


def _head_inputs(
    projection: Projection, heads: int, head_dim: int, norm: nn.Module | None
) -> tuple[Callable, Callable]:
    """``take`` and ``put`` of a per-head input site (:data:`NODE_INPUTS`) computed by ``projection``:
    ``take`` copies the layer's input ``[batch, pos, d_model]`` once per head; ``put`` computes each head's
    ``head_dim`` rows of the projection's output from its own copy (through ``norm`` first, if any)."""

    def take(layer_input: torch.Tensor) -> torch.Tensor:
        return layer_input.unsqueeze(-2).expand(*layer_input.shape[:-1], heads, layer_input.shape[-1])

    def put(whole: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        rows = torch.tensor(projection.rows(list(range(heads)), head_dim), device=whole.device)
        weight = linear_weight(projection.linear).index_select(0, rows).unflatten(0, (heads, head_dim))
        normed = part if norm is None else norm(part)
        features = torch.einsum("bphd,hed->bphe", normed.to(weight.dtype), weight)
        bias = projection.linear.bias
        if bias is not None:
            features = features + bias.index_select(0, rows).unflatten(0, (heads, head_dim))
        return whole.index_copy(-1, rows, features.flatten(-2).to(whole.dtype))

    return take, put


def _split_heads(head_dim: int) -> tuple[Callable, Callable]:
    return (lambda whole: whole.unflatten(-1, (-1, head_dim)), lambda _whole, part: part.flatten(-2))


def _spot(model: PreTrainedModel, parts: AttentionParts, layer: nn.Module, name: str) -> _Spot:
    """Where site ``name`` of one layer (module ``layer``, attention ``parts``) is."""
    shape = layout(model)
    if name == "resid_pre":
        return _Spot(layer, True)
    if name == "resid_post":
        return _Spot(layer, False)
    if name in ("q", "k", "v"):
        projection = {"q": parts.query, "k": parts.key, "v": parts.value}[name]
        heads = parts.heads if name == "q" else parts.key_value_heads
        take, put = _heads(projection, heads, parts.head_dim, parts.module)
        return _Spot(projection.linear, False, take=take, put=put)
    if name in ("q_input", "k_input", "v_input"):
        if shape.mid_is_input and shape.attn_norm is None:
            raise BertologyError(
                f"Site {name!r} needs the norm before attention, which bertology does not know for a "
                f"{type(model).__name__}."
            )
        projection = {"q": parts.query, "k": parts.key, "v": parts.value}[name[0]]
        heads = parts.heads if name == "q_input" else parts.key_value_heads
        norm = None if shape.attn_norm is None else layer.get_submodule(shape.attn_norm)
        take, put = _head_inputs(projection, heads, parts.head_dim, norm)
        return _Spot(projection.linear, False, take=take, put=put)
    if name == "mlp_in":
        if not shape.mid_is_input:
            raise BertologyError(
                f"Site 'mlp_in' is for pre-norm models; a {type(model).__name__} normalises its residual "
                "stream after each block."
            )
        return _Spot(layer.get_submodule(shape.mid), True)
    if name == "z":
        take, put = _split_heads(parts.head_dim)
        return _Spot(parts.output, True, take=take, put=put)
    if name == "attn_out":
        return _Spot(parts.output if shape.attn_out is None else layer.get_submodule(shape.attn_out), False)
    if name == "resid_mid":
        return _Spot(layer.get_submodule(shape.mid), shape.mid_is_input)
    if name == "mlp_out":
        return _Spot(layer.get_submodule(shape.mlp), False)
    raise AssertionError(name)


def _model_spot(model: PreTrainedModel, name: str) -> _Spot:
    """Where a site without layers is."""
    if name == "embed":
        return _Spot(model.get_input_embeddings(), False)
    if name == "final":
        return _Spot(model.base_model, False, "last_hidden_state")
    if model.base_model is model:
        raise BertologyError(
            f"A {type(model).__name__} has no logits: load the model with a head (a language model or a "
            "classifier) to record them."
        )
    return _Spot(model, False, "logits")


# --- Hooks ------------------------------------------------------------------------------------------------


def _whole(spot: _Spot, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> torch.Tensor:
    """The tensor of one call of ``spot.module`` that holds the site."""
    if spot.is_input:
        return args[0] if args else kwargs["hidden_states"]
    if isinstance(spot.field, str):
        return getattr(output, spot.field)
    return output if isinstance(output, torch.Tensor) else output[spot.field]


def _with_whole(
    spot: _Spot, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, whole: torch.Tensor
) -> Any:
    """The module's input ``(args, kwargs)`` or its output with the tensor that holds the site replaced."""
    if spot.is_input:
        return ((whole, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": whole})
    if isinstance(spot.field, str):
        setattr(output, spot.field, whole)
        return output
    if isinstance(output, torch.Tensor):
        return whole
    return (*output[: spot.field], whole, *output[spot.field + 1 :])


#: What a hook does at one site of one layer: ``(key, spot, args, kwargs, output)`` -> the module's new
#: input ``(args, kwargs)`` or output, or ``None`` to leave it.
_Action = Callable[[SiteKey, _Spot, tuple[Any, ...], dict[str, Any], Any], Any]


class _Layers:
    """Which layer runs now, from a forward pre-hook on each layer module: ``entered`` counts the layers
    entered in this forward pass (:meth:`restart` at its start); ALBERT's shared layer is layer ``entered
    % layers``."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.modules = layer_modules(model)
        self.index = {id(module): index for index, module in enumerate(self.modules)}
        self.shared = shares_layers(model)
        self.entered = 0
        self.current: int | None = None

    def restart(self, *_: object) -> None:
        self.entered = 0

    def enter(self, module: nn.Module, *_: object) -> None:
        self.current = self.entered % len(self.modules) if self.shared else self.index[id(module)]
        self.entered += 1


class _SiteHook:
    """The hook of one site on one module: it acts once per layer entered (DeBERTa-v2 calls its shared
    query and key projections again on the relative positions), only in ``layers``."""

    def __init__(
        self, name: str, spot: _Spot, layers: set[int | None], running: _Layers, action: _Action
    ) -> None:
        self.name, self.spot, self.layers, self.running, self.action = name, spot, layers, running, action
        self.acted_in = -1

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        layer = None if self.layers == {None} else self.running.current
        if layer not in self.layers or (layer is not None and self.acted_in == self.running.entered):
            return None
        self.acted_in = self.running.entered
        return self.action((self.name, layer), self.spot, args, kwargs, output)


def _hook_sites(model: PreTrainedModel, keys: Iterable[SiteKey], action: _Action, stack: ExitStack) -> None:
    """Register on ``model``, until ``stack`` closes, a hook at every site of ``keys`` (except ``pattern``,
    which :mod:`bertology.models.hook` records) that calls ``action``."""
    running = _Layers(model)
    stack.callback(model.base_model.register_forward_pre_hook(running.restart).remove)
    for module in {id(module): module for module in running.modules}.values():
        stack.callback(module.register_forward_pre_hook(running.enter).remove)
    parts = attention_parts(model)
    hooks: dict[tuple[int, bool, str], _SiteHook] = {}
    for name, layer in keys:
        if name == "pattern":
            continue
        if layer is None:
            spot = _model_spot(model, name)
        else:
            spot = _spot(model, parts[layer], running.modules[layer], name)
        slot = (id(spot.module), spot.is_input, name)
        if slot in hooks:  # ALBERT: the same module for every layer
            hooks[slot].layers.add(layer)
            continue
        hooks[slot] = site_hook = _SiteHook(name, spot, {layer}, running, action)
        if spot.is_input:
            handle = spot.module.register_forward_pre_hook(
                lambda _module, args, kwargs, run=site_hook: run(args, kwargs, None), with_kwargs=True
            )
        else:
            handle = spot.module.register_forward_hook(
                lambda _module, args, kwargs, output, run=site_hook: run(args, kwargs, output),
                with_kwargs=True,
            )
        stack.callback(handle.remove)


# --- Reading and replacing sites --------------------------------------------------------------------------


def _ungrouped(cache: Cache, parts: list[AttentionParts]) -> None:
    """Repeat each recorded key/value head for the query heads that share it (grouped-query attention)."""
    for (name, layer), tensor in cache.items():
        if name in ("k", "v") and layer is not None and parts[layer].groups > 1:
            cache[name, layer] = tensor.repeat_interleave(parts[layer].groups, dim=-2)


@contextmanager
def recording(
    model: PreTrainedModel, sites: Iterable[SiteRequest], *, ungroup: bool = False, detach: bool = True
) -> Iterator[Cache]:
    """Keep the tensors of ``sites`` (names: every layer; ``(name, layer)``: one) of the forward passes of
    ``model`` made inside the block, in the :class:`Cache` it yields (a later pass overwrites an earlier
    one's). ``ungroup``: grouped-query ``k`` and ``v`` get one head per query head when the block ends.
    ``detach``: keep the tensors off the autograd graph. ``pattern`` needs a model whose attention goes
    through :mod:`bertology.models.hook` (loaded with ``bertology.load_model``).

    Raises:
        BertologyError: an unknown site, a layer the model does not have, or ``logits`` of a model
            without a head.
    """
    keys = _keys(model, sites)
    for name, _layer in keys:
        if name in NODE_INPUTS:
            raise BertologyError(f"The {name!r} site can be replaced but not recorded.")
    cache = Cache()

    def keep(key: SiteKey, spot: _Spot, args: tuple, kwargs: dict, output: Any) -> None:
        tensor = spot.take(_whole(spot, args, kwargs, output))
        cache[key] = tensor.detach() if detach else tensor

    patterns = sorted(layer for name, layer in keys if name == "pattern")
    with ExitStack() as stack:
        _hook_sites(model, keys, keep, stack)
        recorder = stack.enter_context(hook.recording(keep_graph=not detach)) if patterns else None
        yield cache
    if recorder is not None:
        if len(recorder.calls) < len(layer_modules(model)):
            raise BertologyError(
                "The 'pattern' site needs a model loaded with bertology.load_model (its attention recorded)."
            )
        for layer in patterns:
            cache["pattern", layer] = recorder.calls[-len(layer_modules(model)) + layer].probs
    if ungroup:
        _ungrouped(cache, attention_parts(model))


#: What :func:`replacing` puts in a site's place: ``fn(tensor, layer)`` -> a tensor of the same shape.
Replacement = Callable[[torch.Tensor, int | None], torch.Tensor]


@contextmanager
def replacing(model: PreTrainedModel, replacements: Mapping[SiteRequest, Replacement]) -> Iterator[None]:
    """Inside the block, every forward pass of ``model`` puts ``fn(tensor, layer)`` in the place of each
    site's tensor (``{"z": fn}``: every layer; ``{("z", 2): fn}``: layer 2), before anything downstream
    reads it. ``k`` and ``v`` are replaced per key/value head. In a pre-norm model the residual stream
    between the blocks (``resid_mid``) is a sum the layer never hands to a module: it is replaced through
    what the attention block adds (``fn(resid_pre + attn_out) - resid_pre``). The sites of
    :data:`NODE_INPUTS` change one node's input only: ``fn`` gets ``[batch, pos, head, d_model]`` copies of
    the layer's input (``q_input``, ``k_input``, ``v_input``) or the feed-forward block's input
    (``mlp_in``).

    Raises:
        BertologyError: an unknown site or layer, or ``pattern`` (recorded only, not replaced).
    """
    functions: dict[SiteKey, Replacement] = {}
    for request, function in replacements.items():
        for key in _keys(model, [request]):
            if key[0] == "pattern":
                raise BertologyError("The 'pattern' site can be recorded but not replaced.")
            functions[key] = function
    mids = (
        {layer for name, layer in functions if name == "resid_mid"} if layout(model).mid_is_input else set()
    )
    inputs: dict[int | None, torch.Tensor] = {}
    # the per-head input sites are built from the layer's input (as replaced, if it is)
    split = {layer for name, layer in functions if name in _PER_HEAD_INPUTS}
    layer_inputs: dict[int | None, torch.Tensor] = {}

    def put(key: SiteKey, spot: _Spot, args: tuple, kwargs: dict, output: Any) -> Any:
        name, layer = key
        whole = _whole(spot, args, kwargs, output)
        if key in functions:
            source = layer_inputs[layer] if name in _PER_HEAD_INPUTS else whole
            whole = spot.put(whole, functions[key](spot.take(source), layer))
        if layer in split and name == "resid_pre":
            layer_inputs[layer] = whole
        if layer in mids and name == "resid_pre":
            inputs[layer] = whole
        if layer in mids and name == "attn_out":
            residual = inputs.pop(layer)
            whole = functions["resid_mid", layer](residual + whole, layer) - residual
        return _with_whole(spot, args, kwargs, output, whole)

    hooked = {key for key in functions if not (key[0] == "resid_mid" and key[1] in mids)}
    hooked |= {(name, layer) for layer in mids for name in ("resid_pre", "attn_out")}
    hooked |= {("resid_pre", layer) for layer in split}
    with ExitStack() as stack:
        _hook_sites(model, hooked, put, stack)
        yield


def trace(
    model: PreTrainedModel,
    inputs: Mapping[str, torch.Tensor],
    sites: Iterable[SiteRequest] = tuple(SITES),
    *,
    ungroup: bool = False,
) -> Cache:
    """Run ``model`` once on ``inputs`` (a tokenizer's tensors) without gradients and return the tensors of
    ``sites`` (default: every site the model has), as TransformerLens's ``run_with_cache``.

    Raises:
        BertologyError: as :func:`recording`.
    """
    if sites is SITES or tuple(sites) == tuple(SITES):
        sites = [name for name in SITES if name != "logits" or model.base_model is not model]
    with torch.no_grad(), recording(model, sites, ungroup=ungroup) as cache:
        model(**inputs)
    return cache
