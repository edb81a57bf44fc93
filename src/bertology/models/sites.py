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

Any module can be read by its path as well: ``("module", "bert.encoder.layer.3.output")`` is that module's
output and ``("module_input", path)`` its first input, at every call (the training recorders read every
activation function this way). This module is the only code in bertology that registers hooks: everything
goes through :func:`hook_module` (a hook that stays until its handle removes it: the attention capture of
the module route, head gates, a pruned model's heads) or :func:`hooking` (hooks for one ``with`` block),
and :func:`recording` and :func:`replacing` are built on them.

An encoder-decoder (BART, T5) has three attentions, its *stacks* (``encoder``, ``decoder``, ``cross``, as
``heads.csv``'s ``stack`` column): its sites name their stack before a colon, ``"encoder:z"``,
``"decoder:q"``, ``"cross:pattern"`` (TransformerLens's ``encoder.{l}.attn.hook_z``,
``decoder.{l}.attn.hook_q``, ``decoder.{l}.cross_attn.hook_pattern``), with the layers of that stack
(cross-attention's are the decoder's). Each stack has ``q``, ``k``, ``v``, ``pattern``, ``z`` and
``attn_out``; the encoder and the decoder also ``resid_pre`` and ``resid_post`` (a layer's input and
output). Cross-attention's ``k`` and ``v`` are over the source's positions, its ``pattern``
``[batch, head, target_pos, source_pos]``.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import PreTrainedModel

from bertology.errors import BertologyError
from bertology.models import hook
from bertology.models.anatomy import (
    STACKS,
    AttentionParts,
    Projection,
    attention_calls,
    attention_parts,
    gated_parts,
    has_stacks,
    has_submodule,
    layer_modules,
    layout,
    linear_weight,
    shares_layers,
    stack_layer_modules,
    stack_parts,
    stacks,
)
from bertology.models.model_types import Layout

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

#: Sites named by a module's path (``model.get_submodule(path)``): its output, its first input.
MODULE_SITES = ("module", "module_input")

#: ``"z"`` (every layer), ``("z", 3)`` (layer 3), ``("final", None)`` or ``("module", path)``; an
#: encoder-decoder's ``"cross:z"`` or ``("cross:z", 1)``.
SiteRequest = str | tuple[str, int | str | None]
#: A site of one layer (``None`` for the sites that are not per layer; a module's path for
#: :data:`MODULE_SITES`).
SiteKey = tuple[str, int | str | None]

#: The sites of each stack of an encoder-decoder (cross-attention's layers have no input or output of
#: their own).
STACK_SITES: dict[str, tuple[str, ...]] = {
    "encoder": ("resid_pre", "q", "k", "v", "pattern", "z", "attn_out", "resid_post"),
    "decoder": ("resid_pre", "q", "k", "v", "pattern", "z", "attn_out", "resid_post"),
    "cross": ("q", "k", "v", "pattern", "z", "attn_out"),
}

#: Sites that exist to be replaced, not recorded: the input of one node of a circuit's graph
#: (:mod:`bertology.interventions.circuit_graph`), as TransformerLens computes them with
#: ``use_split_qkv_input``. Replacing ``q_input`` gives each head its own copy of the layer's input
#: ``[batch, pos, head, d_model]`` (before the norm a pre-norm model applies), from which its queries are
#: computed again (``k_input`` and ``v_input``: per key/value head); ``qkv_input`` is the one input all
#: of them are computed from (the attention block's norm's input, in pre-norm models), changed for the
#: attention block only; ``mlp_in`` is what enters the feed-forward block (before its norm; in a post-norm
#: layer, :attr:`Layout.mlp_input`'s input), changed for that block only, not in the residual stream.
NODE_INPUTS: dict[str, Site] = {
    site.name: site
    for site in (
        Site("q_input", ("batch", "pos", "head", "d_model"), True, "blocks.{l}.hook_q_input",  # type: ignore[arg-type]
             "each head's own copy of the layer's input, for its queries"),
        Site("k_input", ("batch", "pos", "head", "d_model"), True, "blocks.{l}.hook_k_input",  # type: ignore[arg-type]
             "each key/value head's own copy of the layer's input, for its keys"),
        Site("v_input", ("batch", "pos", "head", "d_model"), True, "blocks.{l}.hook_v_input",  # type: ignore[arg-type]
             "each key/value head's own copy of the layer's input, for its values"),
        Site("qkv_input", ("batch", "pos", "d_model"), True, "(none: blocks.{l}.hook_attn_in is per head)",  # type: ignore[arg-type]
             "the attention block's own input, before its norm, that every head's queries, keys and values "
             "read (pre-norm models)"),
        Site("mlp_in", ("batch", "pos", "d_model"), True, "blocks.{l}.hook_mlp_in",  # type: ignore[arg-type]
             "the feed-forward block's own input, before its norm (pre-norm models; in a post-norm "
             "one the attention block's normalised output as the feed-forward block alone reads it)"),
    )
}  # fmt: skip

_PER_HEAD_INPUTS = ("q_input", "k_input", "v_input")


def stacked_name(stack: str, name: str) -> str:
    """An encoder-decoder's site ``name`` of ``stack``: ``"cross:z"``."""
    return f"{stack}:{name}"


def site_of(name: str) -> Site:
    """The :class:`Site` a site name names (an encoder-decoder's without its stack: ``"cross:z"`` is
    ``z``)."""
    return SITES[name.rpartition(":")[2]]


def over_source(name: str) -> bool:
    """True for an encoder-decoder's site whose positions are the source's: the encoder's, and
    cross-attention's keys and values (computed from the encoder's output); the decoder's and
    cross-attention's other sites are over the target's positions."""
    stack, _, base = name.rpartition(":")
    return stack == "encoder" or (stack == "cross" and base in ("k", "v"))


def site_names(model: PreTrainedModel) -> list[str]:
    """Every site name ``model`` has: :data:`SITES` (``logits`` only with a head), or an encoder-decoder's
    stacked names (:data:`STACK_SITES`)."""
    if has_stacks(model):
        return [stacked_name(stack, name) for stack, names in STACK_SITES.items() for name in names]
    return [name for name in SITES if name != "logits" or model.base_model is not model]


def _split_name(model: PreTrainedModel, name: str) -> tuple[str | None, str, int]:
    """``(stack or None, site name, layers)`` of a requested site name.

    Raises:
        BertologyError: a name that is no site of ``model`` (an encoder-decoder's without its stack, a
            stack asked of another model).
    """
    stack, _, base = name.rpartition(":")
    if not has_stacks(model):
        if stack or (name not in SITES and name not in NODE_INPUTS):
            raise BertologyError(
                f"There is no site {name!r}; the sites are {', '.join(SITES)}, and a module's by its path: "
                f"{' and '.join(MODULE_SITES)}."
            )
        return None, name, len(layer_modules(model))
    if stack not in STACK_SITES or base not in STACK_SITES[stack]:
        raise BertologyError(
            f"An encoder-decoder's sites name their stack ({', '.join(STACKS)}), e.g. 'cross:z'; there is no "
            f"site {name!r} (the sites are {', '.join(site_names(model))})."
        )
    return stack, base, len(stack_layer_modules(model, stack))


def _keys(model: nn.Module, requests: Iterable[SiteRequest]) -> list[SiteKey]:
    """The ``(name, layer)`` of every site ``requests`` names, in request order.

    Raises:
        BertologyError: an unknown site name, a layer the model does not have, or a module path that
            names no module of the model.
    """
    keys: list[SiteKey] = []
    for request in requests:
        name, layer = (request, None) if isinstance(request, str) else request
        if name in MODULE_SITES:
            if not isinstance(layer, str) or not has_submodule(model, layer):
                raise BertologyError(
                    f"Site {name!r} needs the path of one of the model's modules, not {layer!r}."
                )
            keys.append((name, layer))
            continue
        _stack, base, layers = _split_name(model, name)
        site = SITES.get(base) or NODE_INPUTS[base]
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


def _head_weight(projection: Projection, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the output rows of ``projection`` that hold the heads' features, in head order, [heads * head_dim]
    int; their weights [heads, head_dim, d_model], a view where the rows are one block)."""
    rows = torch.tensor(projection.rows(list(range(heads)), head_dim), device=projection.linear.weight.device)
    weight = linear_weight(projection.linear)
    if projection.step == head_dim:
        return rows, weight.narrow(0, projection.first, heads * head_dim).unflatten(0, (heads, head_dim))
    return rows, weight.index_select(0, rows).unflatten(0, (heads, head_dim))


def _head_inputs(
    projection: Projection, heads: int, head_dim: int, norm: nn.Module | None
) -> tuple[Callable, Callable]:
    """``take`` and ``put`` of a per-head input site (:data:`NODE_INPUTS`) computed by ``projection``:
    ``take`` copies the layer's input ``[batch, pos, d_model]`` once per head; ``put`` computes each head's
    ``head_dim`` rows of the projection's output from its own copy (through ``norm`` first, if any), or,
    where every head's copy is one tensor broadcast over the heads (stride 0, as ``take`` gives it), from
    that one input at once."""

    def take(layer_input: torch.Tensor) -> torch.Tensor:
        return layer_input.unsqueeze(-2).expand(*layer_input.shape[:-1], heads, layer_input.shape[-1])

    def put(whole: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        rows, weight = _head_weight(projection, heads, head_dim)
        batch, pos = part.shape[:2]
        if part.stride(2) == 0:
            shared = part[:, :, 0].flatten(0, 1)[None]  # [1, batch * pos, d_model]
            features = _projected(norm, shared, weight.flatten(0, 1)[None])[0].view(batch, pos, -1)
        else:
            # [heads, batch * pos, d_model]: a view where the copies were made head by head
            per_head = part.permute(2, 0, 1, 3).flatten(1, 2)
            features = _projected(norm, per_head, weight).view(heads, batch, pos, head_dim)
            features = features.permute(1, 2, 0, 3).flatten(-2)
        bias = projection.linear.bias
        if bias is not None:
            features = features + bias.index_select(0, rows)
        if projection.first == 0 and projection.step == head_dim and len(rows) == whole.shape[-1]:
            return features.to(whole.dtype)  # the heads' rows are the whole output, in order
        return whole.index_copy(-1, rows, features.to(whole.dtype))

    return take, put


def _is_rms_norm(norm: nn.Module | None) -> bool:
    """Whether ``norm`` is a Llama-style RMSNorm: ``w * x / sqrt(mean(x^2) + variance_epsilon)``."""
    return hasattr(norm, "variance_epsilon") and "RMSNorm" in type(norm).__name__


def _rms_scale(norm: nn.Module, stream: torch.Tensor) -> torch.Tensor:
    """[..., 1] float an RMSNorm's scale ``r = (mean(x^2) + eps)^-1/2`` of its input ``stream`` [..., d_model]
    (:func:`_is_rms_norm`)."""
    stream = stream.float()
    square_mean = torch.linalg.vector_norm(stream, dim=-1, keepdim=True).pow(2) / stream.shape[-1]
    return torch.rsqrt(square_mean + norm.variance_epsilon)


def _folded(norm: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [..., out, d_model] float with an RMSNorm's weight folded in: ``W diag(w)``, so that
    ``W (w * x r) = (W diag(w)) x r``."""
    return weight.float() * norm.weight.float()


def _projected(norm: nn.Module | None, inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[groups, rows, out] ``inputs`` [groups, rows, d_model] through ``norm`` (if any), then each group's
    ``weight`` [groups, out, d_model] (no bias). An RMSNorm's weight is folded into the projection and its
    scale applied to the product (``W (w * x) r = (W diag(w)) x r``), so the normalised copies are never
    made."""
    if norm is None:
        return torch.bmm(inputs.to(weight.dtype), weight.transpose(1, 2))
    if _is_rms_norm(norm):
        stream = inputs.float()
        folded = _folded(norm, weight).transpose(1, 2)
        return (torch.bmm(stream, folded) * _rms_scale(norm, stream)).to(weight.dtype)
    return torch.bmm(norm(inputs).to(weight.dtype), weight.transpose(1, 2))


def _head_input_parts(
    shape: Layout, parts: AttentionParts, layer: nn.Module, name: str
) -> tuple[Projection, int, nn.Module | None]:
    """The projection, head count and norm (``None``: none) of per-head input site ``name`` of one layer."""
    if shape.mid_is_input and shape.attn_norm is None:
        raise BertologyError(
            f"Site {name!r} needs the norm before attention, which bertology does not know for layers "
            f"of type {type(layer).__name__}."
        )
    projection = {"q": parts.query, "k": parts.key, "v": parts.value}[name[0]]
    heads = parts.heads if name == "q_input" else parts.key_value_heads
    norm = None if shape.attn_norm is None else layer.get_submodule(shape.attn_norm)
    return projection, heads, norm


def head_input_gradients(model: PreTrainedModel) -> Callable[[int, str], HeadInputGradientSum]:
    """``fn(layer, name)``: a new :class:`HeadInputGradientSum` of per-head input site ``name`` (``q_input``,
    ``k_input``, ``v_input``) of ``layer`` of ``model``."""
    shape, parts, modules = layout(model), attention_parts(model), layer_modules(model)

    def new_sum(layer: int, name: str) -> HeadInputGradientSum:
        projection, heads, norm = _head_input_parts(shape, parts[layer], modules[layer], name)
        head_dim = parts[layer].head_dim
        rows, weight = _head_weight(projection, heads, head_dim)
        bias = projection.linear.bias
        bias = None if bias is None else bias.detach().float().index_select(0, rows).view(heads, head_dim)
        block = slice(projection.first, projection.first + heads * head_dim)  # where the rows are one block
        where = block if projection.step == head_dim else rows
        return HeadInputGradientSum(norm, weight.detach().float(), where, bias)

    return new_sum


class HeadInputGradientSum:
    """The gradient at the per-head input copies of one per-head input site (``q_input``, ``k_input``,
    ``v_input``) of one layer, averaged over passes left as the model computes them, from the gradient at
    the output of the layer's projection (the linear layer's, whose rows hold the heads' features, sites
    ``q``, ``k``, ``v``): each head's rows of the projection transposed, then the norm's vector-Jacobian
    product at the layer's input (one per head), as back-propagating through the copies that
    :func:`replacing` makes would give, without making them. :meth:`add` takes one pass, :meth:`write`
    the mean.

    ``norm``: the norm before the projection (``None``: none); ``weight`` [heads, head_dim, d_model] float
    the heads' rows of the projection, ``rows`` where they are among its outputs (a slice where they are
    one block), ``bias`` [heads, head_dim] float theirs of the projection's bias (``None``: none).

    An RMSNorm (``y = w * x r``, ``r = (mean(x^2) + eps)^-1/2``) by its formula: the pullback of ``a =
    W^T g`` is ``r (w a) - r^3 x (x . w a) / d``, and ``x . w a = g . W (w x) = g . (q - b) / r`` (``q`` the
    head's rows of the projection's output, ``b`` of its bias), so per head ``r W^T g`` (``w`` folded into
    ``W``) less ``r^2 (g . (q - b)) / d`` times ``x``: a product over ``head_dim``, not ``d_model``, per
    position; the first term is linear in ``r g``, summed over the passes before the one product by ``W``.
    Any other norm by ``torch.func`` (its vector-Jacobian product under ``vmap``), per pass; no norm:
    ``W^T`` of the summed ``g``."""

    def __init__(
        self,
        norm: nn.Module | None,
        weight: torch.Tensor,
        rows: torch.Tensor | slice,
        bias: torch.Tensor | None,
    ) -> None:
        self.norm, self.rows, self.bias = norm, rows, bias
        self.rms = norm is not None and _is_rms_norm(norm)
        self.weight = _folded(norm, weight).detach() if self.rms else weight
        self.passes = 0
        # [heads, batch * pos, head_dim] the sum of g (an RMSNorm: of r g)
        self.summed: torch.Tensor | None = None
        # an RMSNorm's per pass: (x [batch * pos, d_model], r^2 (g . (q - b)) / d [heads, batch * pos, 1])
        self.along: list[tuple[torch.Tensor, torch.Tensor]] = []
        # another norm's per pass: (the layer input, g [heads, batch * pos, head_dim])
        self.general: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _heads(self, whole: torch.Tensor) -> torch.Tensor:
        """[heads, batch * pos, head_dim] float the heads' rows of ``whole`` [batch, pos, outputs]."""
        part = whole[..., self.rows] if isinstance(self.rows, slice) else whole.index_select(-1, self.rows)
        heads, head_dim = self.weight.shape[:2]
        return part.detach().float().unflatten(-1, (heads, head_dim)).permute(2, 0, 1, 3).flatten(1, 2)

    def add(
        self, layer_input: torch.Tensor, output: torch.Tensor, gradient: torch.Tensor, copies: int = 1
    ) -> None:
        """One pass: its layer input [batch, pos, d_model], the projection's output [batch, pos, outputs]
        and the gradient there; or ``copies`` passes side by side (copy ``k``: rows ``k * batch .. (k + 1) *
        batch - 1`` of each), each taken as one."""
        if copies > 1:
            for parts in zip(
                *(tensor.chunk(copies) for tensor in (layer_input, output, gradient)), strict=True
            ):
                self.add(*parts)
            return
        self.passes += 1
        rows = self._heads(gradient)
        if self.norm is not None and not self.rms:
            self.general.append((layer_input.detach(), rows))
            return
        if self.rms:
            stream = layer_input.detach().float().flatten(0, 1)
            rms = _rms_scale(self.norm, stream)
            if output.dtype == torch.float32:
                projected = (
                    self._heads(output) if self.bias is None else self._heads(output) - self.bias[:, None]
                )
            else:  # the output in a lower precision: W (w x) r again in float
                projected = torch.matmul(stream * rms, self.weight.transpose(1, 2))
            self.along.append(
                (stream, (rows * projected).sum(-1, keepdim=True) * rms.pow(2) / stream.shape[-1])
            )
            rows = rows * rms
        self.summed = rows if self.summed is None else self.summed.add_(rows)

    def write(self, out: torch.Tensor, tokens: slice = slice(None)) -> None:
        """Write the mean over the passes at ``tokens`` (of the batch's positions taken row after row) into
        ``out`` [heads, tokens, d_model] float."""
        scale = 1 / self.passes
        if self.summed is None:
            out.zero_()
        else:
            torch.bmm(self.summed[:, tokens] * scale, self.weight, out=out)
        for stream, along in self.along:
            out.addcmul_(along[:, tokens], stream[tokens], value=-scale)
        for layer_input, rows in self.general:
            _, pullback = torch.func.vjp(lambda x: self.norm(x).float(), layer_input.flatten(0, 1)[tokens])  # type: ignore[misc]
            features = torch.bmm(rows[:, tokens], self.weight)  # [heads, tokens, d_model]
            out.add_(torch.vmap(pullback)(features)[0].float(), alpha=scale)


def _split_heads(head_dim: int) -> tuple[Callable, Callable]:
    return (lambda whole: whole.unflatten(-1, (-1, head_dim)), lambda _whole, part: part.flatten(-2))


def _spot(shape: Layout, parts: AttentionParts, layer: nn.Module, name: str) -> _Spot:
    """Where site ``name`` of one layer (module ``layer``, attention ``parts``, of a model of layout
    ``shape``) is."""
    if name == "resid_pre":
        return _Spot(layer, True)
    if name == "resid_post":
        return _Spot(layer, False)
    if name in ("q", "k", "v"):
        projection = {"q": parts.query, "k": parts.key, "v": parts.value}[name]
        heads = parts.heads if name == "q" else parts.key_value_heads
        take, put = _heads(projection, heads, parts.head_dim, parts.module)
        return _Spot(projection.linear, False, take=take, put=put)
    if name in _PER_HEAD_INPUTS:
        projection, heads, norm = _head_input_parts(shape, parts, layer, name)
        take, put = _head_inputs(projection, heads, parts.head_dim, norm)
        return _Spot(projection.linear, False, take=take, put=put)
    if name == "qkv_input":
        if not shape.mid_is_input or shape.attn_norm is None:
            raise BertologyError(
                f"Site 'qkv_input' is the input of the norm before attention, which layers of type "
                f"{type(layer).__name__} do not have (bertology knows it for pre-norm models)."
            )
        return _Spot(layer.get_submodule(shape.attn_norm), True)
    if name == "mlp_in":
        if shape.mid_is_input:
            return _Spot(layer.get_submodule(shape.mid), True)
        if shape.mlp_input is None:
            raise BertologyError(
                f"Site 'mlp_in' needs the feed-forward block's input, which bertology does not know for "
                f"post-norm layers of type {type(layer).__name__}."
            )
        return _Spot(layer.get_submodule(shape.mlp_input), True)
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


def _model_spot(model: PreTrainedModel, name: str, path: str | None) -> _Spot:
    """Where a site without layers is (``path``: the module of a :data:`MODULE_SITES` site)."""
    if path is not None:
        return _Spot(model.get_submodule(path), name == "module_input")
    if name == "embed":
        return _Spot(model.get_input_embeddings(), False)
    if name == "final":
        # the layers' own module where the base model has one (BERT's encoder, whose output its pooler
        # reads, not the base model's), else the base model (its output after a final norm)
        stack, within, _ = layout(model).layers.partition(".")
        module = model.base_model.get_submodule(stack) if within else model.base_model
        return _Spot(module, False, "last_hidden_state")
    if model.base_model is model:
        raise BertologyError(
            f"A {type(model).__name__} has no logits: load the model with a head (a language model or a "
            "classifier) to record them."
        )
    return _Spot(model, False, "logits")


# --- Hooks: the one place they are registered -------------------------------------------------------------

#: A hook on the calls of one module: ``fn(module, args, kwargs, output)`` (``output`` ``None`` for a hook
#: on the input, which runs before the call) returns what the call gets instead, ``(args, kwargs)`` on the
#: input and the output after it, or ``None`` to leave the call as it is.
ModuleHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Any]


def hook_module(module: nn.Module, fn: ModuleHook, *, before: bool = False) -> RemovableHandle:
    """Put ``fn`` on every call of ``module`` (``before``: on its input, before it runs; else on its output)
    until the returned handle's ``remove()``: the only function in bertology that registers a hook. Hooks
    that stay with a model (put on at loading or on first use) call it directly; hooks for one block go
    through :func:`hooking`."""
    if before:
        return module.register_forward_pre_hook(
            lambda hooked, args, kwargs: fn(hooked, args, kwargs, None), with_kwargs=True
        )
    return module.register_forward_hook(fn, with_kwargs=True)


@contextmanager
def hooking(
    before: Iterable[tuple[nn.Module, ModuleHook]] = (), after: Iterable[tuple[nn.Module, ModuleHook]] = ()
) -> Iterator[None]:
    """Inside the block, each ``(module, fn)`` of ``before`` hooks that module's input and each of ``after``
    its output (:func:`hook_module`, in this order); the hooks go when the block ends, however it ends."""
    with ExitStack() as stack:
        for hooks, on_input in ((before, True), (after, False)):
            for module, fn in hooks:
                stack.callback(hook_module(module, fn, before=on_input).remove)
        yield


def returns_hidden_states(layer: nn.Module) -> bool:
    """Whether the forward of layer module ``layer`` is declared to return its hidden states alone (a
    tensor, as the decoder layers of transformers 5 do), so that a :func:`skipping` function may return
    hidden states alone."""
    return inspect.signature(type(layer).forward).return_annotation in (torch.Tensor, "torch.Tensor")


@contextmanager
def skipping(model: PreTrainedModel, layers: Mapping[int, Callable[[torch.Tensor], Any]]) -> Iterator[None]:
    """Inside the block, the layers of ``model`` whose indices ``layers`` holds do not run: a call returns
    ``fn(hidden_states)`` of the layer's hidden-state input [batch, pos, d_model], which must be what the
    layer returns (its hidden states alone where :func:`returns_hidden_states`, else the tuple it returns).
    A layer module several layers share (ALBERT's) takes the first one's ``fn``. Hooks on the layer module
    itself still run (its input and output sites); those on its parts do not. Not a hook: the layer
    module's ``forward`` is set aside for the block."""
    modules = layer_modules(model)
    with ExitStack() as stack:
        set_aside: set[int] = set()
        for index, fn in layers.items():
            module = modules[index]
            if id(module) in set_aside:
                continue
            set_aside.add(id(module))

            def skipped(*args: Any, fn: Callable = fn, **kwargs: Any) -> Any:
                return fn(args[0] if args else kwargs[_input_keyword(kwargs)])

            own = module.__dict__.get("forward")  # one set on the module itself (accelerate's), put back
            module.forward = skipped
            if own is None:
                stack.callback(module.__dict__.pop, "forward")
            else:
                stack.callback(setattr, module, "forward", own)
        yield


def _input_keyword(kwargs: dict[str, Any]) -> str:
    """The keyword a module's first input is passed by when it gets no positional argument."""
    return "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))


def _whole(spot: _Spot, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> torch.Tensor:
    """The tensor of one call of ``spot.module`` that holds the site."""
    if spot.is_input:
        return args[0] if args else kwargs[_input_keyword(kwargs)]
    if isinstance(spot.field, str):
        return getattr(output, spot.field)
    return output if isinstance(output, torch.Tensor) else output[spot.field]


def _with_whole(
    spot: _Spot, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, whole: torch.Tensor
) -> Any:
    """The module's input ``(args, kwargs)`` or its output with the tensor that holds the site replaced."""
    if spot.is_input:
        return ((whole, *args[1:]), kwargs) if args else (args, {**kwargs, _input_keyword(kwargs): whole})
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
    % layers``; an encoder-decoder's layer is its number in its own stack."""

    def __init__(self, model: PreTrainedModel) -> None:
        if has_stacks(model):
            per_stack = [stack_layer_modules(model, stack) for stack in ("encoder", "decoder")]
            self.modules = [module for modules in per_stack for module in modules]
            self.index = {id(module): index for modules in per_stack for index, module in enumerate(modules)}
        else:
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
    """The hook of one site on one module. A per-layer site's (``running`` given) acts once per layer
    entered (DeBERTa-v2 calls its shared query and key projections again on the relative positions), only
    in ``layers``; any other site's acts at every call (``layers``: its one key's second part)."""

    def __init__(
        self,
        name: str,
        spot: _Spot,
        layers: set[int | str | None],
        running: _Layers | None,
        action: _Action,
    ) -> None:
        self.name, self.spot, self.layers, self.running, self.action = name, spot, layers, running, action
        self.acted_in = -1

    def __call__(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        if self.running is None:
            (layer,) = self.layers
            return self.action((self.name, layer), self.spot, args, kwargs, output)
        layer = self.running.current
        if layer not in self.layers or self.acted_in == self.running.entered:
            return None
        self.acted_in = self.running.entered
        return self.action((self.name, layer), self.spot, args, kwargs, output)


def _where(model: PreTrainedModel) -> Callable[[str, int], _Spot]:
    """``where(name, layer)``: the spot of a per-layer site of ``model`` (an encoder-decoder's names
    stacked)."""
    if not has_stacks(model):
        shape, parts, modules = layout(model), attention_parts(model), layer_modules(model)
        return lambda name, layer: _spot(shape, parts[layer], modules[layer], name)
    found = {
        stack: (getattr(stacks(model), stack), stack_parts(model, stack), stack_layer_modules(model, stack))
        for stack in STACKS
    }

    def where(name: str, layer: int) -> _Spot:
        stack, _, base = name.rpartition(":")
        shape, parts, modules = found[stack]
        return _spot(shape, parts[layer], modules[layer], base)

    return where


def require_site(model: PreTrainedModel, name: str, layer: int = 0) -> None:
    """Raise, before any pass, what hooking per-layer site ``name`` of ``layer`` of ``model`` would raise.

    Raises:
        BertologyError: a site the model's layers do not have, or whose module bertology does not know.
    """
    _where(model)(name, layer)


def _hook_sites(model: PreTrainedModel, keys: Iterable[SiteKey], action: _Action, stack: ExitStack) -> None:
    """Register on ``model``, until ``stack`` closes, a hook at every site of ``keys`` (except ``pattern``,
    which :mod:`bertology.models.hook` records) that calls ``action``."""
    keys = [key for key in keys if key[0].rpartition(":")[2] != "pattern"]
    before: list[tuple[nn.Module, ModuleHook]] = []
    after: list[tuple[nn.Module, ModuleHook]] = []
    running = None
    if any(isinstance(layer, int) for _, layer in keys):
        running, where = _Layers(model), _where(model)
        before.append((model.base_model, running.restart))
        before.extend((module, running.enter) for module in {id(m): m for m in running.modules}.values())
    hooks: dict[tuple[int, bool, str], _SiteHook] = {}
    for name, layer in keys:
        per_layer = running if isinstance(layer, int) else None
        spot = where(name, layer) if per_layer is not None else _model_spot(model, name, layer)
        slot = (id(spot.module), spot.is_input, name if per_layer is not None else f"{name}:{layer}")
        if slot in hooks:  # ALBERT: the same module for every layer
            hooks[slot].layers.add(layer)
            continue
        hooks[slot] = site_hook = _SiteHook(name, spot, {layer}, per_layer, action)
        (before if spot.is_input else after).append((spot.module, site_hook))
    stack.enter_context(hooking(before, after))


# --- Hooks that stay with a model: head gates --------------------------------------------------------------

#: Attribute set on an output projection once it carries :class:`~bertology.models.hook.GateHeads`, and on
#: a base model once it carries :func:`~bertology.models.hook.start_of_pass`.
_GATES_HOOKED = "bertology_gates_hooked"
_PASS_HOOKED = "bertology_pass_hooked"
_hooking_gates = threading.Lock()


def hook_gates(model: PreTrainedModel) -> None:
    """Make :func:`~bertology.models.hook.gating` act on ``model``: each layer's output projection (as
    :mod:`bertology.models.anatomy` finds it) gets :class:`~bertology.models.hook.GateHeads` on its input
    once (ALBERT's, shared by every layer, counts one call per layer), and the model's base model the reset
    of the count at every forward pass, so gates act the same whichever route captures the model's
    attention. Thread-safe; the hooks stay (outside ``gating`` they cost one context-variable lookup per
    layer), and a projection replaced by pruning gets its own at the next call.

    Raises:
        BertologyError: a model type whose layers and projections bertology does not know.
    """
    with _hooking_gates:
        base = model.base_model
        if not getattr(base, _PASS_HOOKED, False):
            hook_module(base, hook.start_of_pass, before=True)
            setattr(base, _PASS_HOOKED, True)
        for parts in gated_parts(model):
            if not getattr(parts.output, _GATES_HOOKED, False):
                hook_module(parts.output, hook.GateHeads(parts.module, parts.head_dim), before=True)
                setattr(parts.output, _GATES_HOOKED, True)


# --- Reading and replacing sites --------------------------------------------------------------------------


def _ungrouped(cache: Cache, parts: list[AttentionParts]) -> None:
    """Repeat each recorded key/value head for the query heads that share it (grouped-query attention)."""
    for (name, layer), tensor in cache.items():
        if name in ("k", "v") and layer is not None and parts[layer].groups > 1:
            cache[name, layer] = tensor.repeat_interleave(parts[layer].groups, dim=-2)


@contextmanager
def recording(
    model: PreTrainedModel,
    sites: Iterable[SiteRequest],
    *,
    ungroup: bool = False,
    detach: bool = True,
    consume: Callable[[SiteKey, torch.Tensor], None] | None = None,
) -> Iterator[Cache]:
    """Keep the tensors of ``sites`` (names: every layer; ``(name, layer)``: one) of the forward passes of
    ``model`` made inside the block, in the :class:`Cache` it yields (a later pass overwrites an earlier
    one's). ``ungroup``: grouped-query ``k`` and ``v`` get one head per query head when the block ends.
    ``detach``: keep the tensors off the autograd graph. ``consume``: hand each tensor to
    ``consume(key, tensor)`` as the pass computes it, every call of the module (streaming statistics), and
    keep nothing (not for ``pattern``). ``pattern`` needs a model whose attention goes through
    :mod:`bertology.models.hook` (loaded with ``bertology.load_model``).

    Raises:
        BertologyError: an unknown site, a layer the model does not have, a path that names no module,
            ``logits`` of a model without a head, or ``pattern`` with ``consume``.
    """
    keys = _keys(model, sites)
    for name, _layer in keys:
        if name in NODE_INPUTS:
            raise BertologyError(f"The {name!r} site can be replaced but not recorded.")
    cache = Cache()
    store = cache.__setitem__ if consume is None else consume

    def keep(key: SiteKey, spot: _Spot, args: tuple, kwargs: dict, output: Any) -> None:
        tensor = spot.take(_whole(spot, args, kwargs, output))
        store(key, tensor.detach() if detach else tensor)

    patterns = [(name, layer) for name, layer in keys if name.rpartition(":")[2] == "pattern"]
    if patterns and consume is not None:
        raise BertologyError("The 'pattern' site is kept at the end of the block, so it cannot be consumed.")
    with ExitStack() as stack:
        _hook_sites(model, keys, keep, stack)
        recorder = stack.enter_context(hook.recording(keep_graph=not detach)) if patterns else None
        yield cache
    if recorder is not None:
        calls = _pattern_calls(model)
        if len(recorder.calls) < len(calls):
            raise BertologyError(
                "The 'pattern' site needs a model loaded with bertology.load_model (its attention recorded)."
            )
        for key in patterns:
            cache[key] = recorder.calls[-len(calls) + calls.index(key)].probs
    if ungroup and not has_stacks(model):
        _ungrouped(cache, attention_parts(model))


def _pattern_calls(model: PreTrainedModel) -> list[SiteKey]:
    """The ``pattern`` site of each attention call of one forward pass, in call order."""
    if has_stacks(model):
        return [(stacked_name(stack, "pattern"), layer) for stack, layer in attention_calls(model)]
    return [("pattern", layer) for layer in range(len(layer_modules(model)))]


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
            if key[0].rpartition(":")[2] == "pattern":
                raise BertologyError("The 'pattern' site can be recorded but not replaced.")
            functions[key] = function
    mids = (
        {layer for name, layer in functions if name == "resid_mid"}
        if not has_stacks(model) and layout(model).mid_is_input
        else set()
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
    sites: Iterable[SiteRequest] | None = None,
    *,
    ungroup: bool = False,
) -> Cache:
    """Run ``model`` once on ``inputs`` (a tokenizer's tensors; an encoder-decoder's with its
    ``decoder_input_ids``) without gradients and return the tensors of ``sites`` (default: every site the
    model has, :func:`site_names`), as TransformerLens's ``run_with_cache``.

    Raises:
        BertologyError: as :func:`recording`.
    """
    sites = None if sites is None else list(sites)
    if sites is None or tuple(sites) == tuple(SITES):
        sites = site_names(model)
    with torch.no_grad(), recording(model, sites, ungroup=ungroup) as cache:
        model(**inputs)
    return cache
