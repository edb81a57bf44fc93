"""The attention call of every layer: where bertology records attention and gates heads.

One of the few modules that touch model internals (with :mod:`bertology.models.anatomy`, which knows where
each architecture keeps its layers and projections, and the modules that use it).

transformers 5 sends every attention call through a function looked up by name in its
``AttentionInterface``. We register one, ``"bertology"``, that runs the model's own eager attention
(its ``eager_attention_forward``; for BERT-style models the same computation in fewer passes, equal to
float rounding) and, while a :class:`Recorder` is active in the current context, keeps what it
computed. Outside a recording it only computes.
A ``ContextVar`` holds the active recorder, so threads (e.g. concurrent web requests) never mix records.
A recorder may instead carry an :class:`AttentionOverride` that computes every attention call and mask of
its forward pass itself (long inputs: fused attention, queries and keys kept;
:mod:`bertology.attention.long_capture`).

Head gates act where the heads' outputs enter each layer's output projection (a hook on its input
that :func:`~bertology.models.sites.hook_gates` puts there), the same for both capture routes: while
:func:`gating` is active, each head's output is multiplied by its gate. ALBERT shares one projection
between all layers, so the gates count the calls: in an encoder every forward pass calls each layer's
output projection once, in layer order. The count starts again at layer 0 whenever a forward pass of the
model starts (a hook on its base model's input), so a pass cut short (an exception inside a layer, a
recording that stops after the last attention) never shifts the passes after it. A ``ContextVar`` holds
the active gates too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.bert.modeling_bert import eager_attention_forward as _bert_eager

IMPLEMENTATION = "bertology"


@dataclass
class AttentionCall:
    """What one attention layer computed for a padded batch.

    probs: [batch, heads, query, key], softmax output (rows sum to 1 over unmasked keys).
    query, key: [batch, heads, tokens, head_dim] before scaling, or ``None`` when not requested (or, in
        the module route, where q·k alone does not give the probabilities).
    scaling: the factor applied to q·k before the mask and softmax (1/sqrt(head_dim) for BERT); NaN where
        the route gives no queries and keys.
    """

    probs: torch.Tensor
    query: torch.Tensor | None
    key: torch.Tensor | None
    scaling: float


class AttentionOverride(Protocol):
    """Computes a recording's attention calls in place of eager attention, e.g. the long-input capture
    (:mod:`bertology.attention.long_capture`), which keeps queries and keys and runs PyTorch's fused
    attention.

    mask: makes the forward pass's attention masks; takes the keyword arguments transformers gives a
        mask function of its ``AttentionMaskInterface`` (``batch_size``, ``q_length``, ``kv_length``,
        ``mask_function``, ``attention_mask``, ...) and returns the mask the attention calls then get.
    attend: one attention call, as :func:`capture_attention` takes it; returns (output [batch, tokens,
        heads, head_dim], probabilities or ``None``). ``last``: the recording's ``stop_after`` ends the pass
        right after this call, so the output is never read (any tensor of its shape will do).
    """

    def mask(self, **kwargs: Any) -> torch.Tensor | None: ...

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        scaling: float,
        dropout: float,
        last: bool,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass
class Recorder:
    """Collects one :class:`AttentionCall` per attention call, in call order (= layer order).

    consume: if set, each call's probs [batch, heads, q, k] are handed to it at once and nothing is
        kept (streaming statistics: the layer's buffer is freed for the next layer).
    keep_graph: keep ``probs`` attached to the autograd graph (not detached), so gradients of a loss
        with respect to the attention weights can be taken (``torch.autograd.grad(loss, probs)``).
    weighting: if set, what is recorded (or consumed) instead of the softmax output:
        ``weighting(call, probs, value)`` with ``call`` the number of attention calls recorded before this
        one and ``value`` [batch, heads, key, head_dim], returning [batch, heads, query, key]
        (e.g. :class:`bertology.attention.norms.NormWeighting`).
    stop_after: if set, the forward pass is cut short once this many calls are recorded (the model's
        layers): what follows the last attention (that layer's feed-forward block, the pooler, a task
        head) does not change any attention, so a caller that reads only attention skips it.
        :func:`recording` ends the pass quietly; the model's output is then never computed.
    override: if set, it computes every attention call and mask instead of eager attention, and nothing
        is recorded here (see :class:`AttentionOverride`); calls still count towards ``stop_after``.
    """

    keep_qk: bool = False
    consume: Callable[[torch.Tensor], None] | None = None
    keep_graph: bool = False
    weighting: Callable[[int, torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None
    stop_after: int | None = None
    override: AttentionOverride | None = None
    calls: list[AttentionCall] = field(default_factory=list)
    seen: int = 0

    def count_call(self) -> None:
        """Count one attention call that :attr:`override` computed (ending the pass after ``stop_after``)."""
        self.seen += 1
        if self.seen == self.stop_after:
            raise _AllLayersRecorded

    def record(
        self,
        probs: torch.Tensor,
        query: torch.Tensor | None,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        scaling: float,
    ) -> None:
        """Take one layer's attention call.

        probs: [batch, heads, query, key]. query: [batch, heads, tokens, head_dim]; key and value:
        [batch, heads or key/value heads, tokens, head_dim] (grouped-query attention shares each key/value
        head among ``heads / key_value_heads`` query heads: kept keys are repeated to one per query head,
        as the model's ``repeat_kv`` does). Both routes call it: the attention function
        (:func:`capture_attention`) with all of them, the module route
        (:mod:`bertology.models.module_capture`) with ``value=None`` and, where q·k alone does not give the
        probabilities, ``query=key=None`` and ``scaling`` NaN. A ``weighting`` must then find the values
        itself (``value`` is ``None``).
        """
        if self.weighting is not None:
            probs = self.weighting(self.seen, probs.detach(), None if value is None else value.detach())
        self.seen += 1
        if self.consume is not None:
            self.consume(probs.detach())
        else:
            keep = self.keep_qk and query is not None and key is not None
            if keep and key.shape[1] != query.shape[1]:
                key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            self.calls.append(
                AttentionCall(
                    probs=probs if self.keep_graph else probs.detach(),
                    query=query.detach() if keep else None,
                    key=key.detach() if keep else None,
                    scaling=float(scaling),
                )
            )
        if self.seen == self.stop_after:
            raise _AllLayersRecorded


class _AllLayersRecorded(Exception):
    """Raised inside the forward pass after a recorder's last wanted call; caught by :func:`recording`."""


_active: ContextVar[Recorder | None] = ContextVar("bertology_recorder", default=None)


def active_recorder() -> Recorder | None:
    """The recorder active in this context (this thread / task), or ``None`` outside a recording."""
    return _active.get()


@contextmanager
def recording(
    keep_qk: bool = False,
    consume: Callable[[torch.Tensor], None] | None = None,
    keep_graph: bool = False,
    weighting: Callable[[int, torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None,
    stop_after: int | None = None,
    override: AttentionOverride | None = None,
) -> Iterator[Recorder]:
    """Record every attention call made in this context (this thread / task) until the block ends
    (``consume``: stream each layer's probs to it instead; ``keep_graph``: keep them differentiable;
    ``weighting``: record other weights than the softmax output; ``stop_after``: cut the forward pass
    short after that many calls, and end the block there without an error; ``override``: compute the
    calls and masks with it instead of eager attention; see :class:`Recorder`)."""
    recorder = Recorder(
        keep_qk=keep_qk,
        consume=consume,
        keep_graph=keep_graph,
        weighting=weighting,
        stop_after=stop_after,
        override=override,
    )
    token = _active.set(recorder)
    try:
        yield recorder
    except _AllLayersRecorded:
        pass
    finally:
        _active.reset(token)


#: Attribute of a self-attention module whose heads were structurally pruned: the original indices of
#: the heads it still computes, in order (gates are looked up by these).
KEPT_HEADS = "bertology_kept_heads"


@dataclass
class HeadGates:
    """Multipliers on each head's output, applied where the heads' outputs enter the layer's output
    projection.

    values: [layers, heads] (one gate per head) or [batch, layers, heads] (one per input of the batch,
        e.g. for per-example gradients); 1 leaves a head as it is, 0 removes it. May require grad.
        Layer ``i`` of ``values`` gates the ``i``-th output projection called in a forward pass; code that
        runs layers ``l..`` of a model by itself gates them with ``values[..., l:, :]`` in a block of its own.
    replacement: per layer, what a gated head's output moves towards: ``[batch or 1, tokens, heads *
        head_dim]`` (as the layer's output projection takes them; ``tokens`` may be 1 to broadcast), or
        ``None`` for zero. The projection then takes ``gate * output + (1 - gate) * replacement``: gate 0
        puts the replacement in the head's place (mean, resample ablation, activation patching).
        Sliced like ``values`` by code that runs layers ``l..`` itself.
    next_layer: the layer of the next output projection call: 0 when a forward pass starts, one more after
        each call.
    """

    values: torch.Tensor
    replacement: Sequence[torch.Tensor] | None = None
    next_layer: int = 0

    @property
    def num_layers(self) -> int:
        return self.values.shape[-2]

    def apply(self, heads_output: torch.Tensor, kept: Sequence[int] | None, head_dim: int) -> torch.Tensor:
        """``heads_output`` [batch, tokens, heads * head_dim] (the heads' outputs side by side, as one layer's
        output projection takes them) times that layer's gates; ``kept``: the original numbers of the heads
        a pruned layer still has."""
        layer = self.next_layer
        if layer >= self.num_layers:
            raise RuntimeError(
                f"Head gates for {self.num_layers} layers saw more attention calls than that in one forward "
                "pass; gate a model loaded with bertology.load_model or wrap_model."
            )
        self.next_layer = layer + 1
        gates = self.values[..., layer, :]
        if kept is not None:
            gates = gates[..., kept]
        heads = heads_output.shape[-1] // head_dim
        if gates.shape[-1] != heads:
            raise ValueError(f"Layer {layer} has {heads} heads but {gates.shape[-1]} gates were given.")
        shape = (1, 1, -1, 1) if gates.dim() == 1 else (gates.shape[0], 1, -1, 1)
        per_head = heads_output.unflatten(-1, (heads, head_dim))
        gates = gates.reshape(shape).to(heads_output.dtype)
        if self.replacement is None:
            return (per_head * gates).flatten(-2)
        replacement = self.replacement[layer].to(heads_output.dtype).unflatten(-1, (heads, head_dim))
        return (per_head * gates + replacement * (1 - gates)).flatten(-2)


_gates: ContextVar[HeadGates | None] = ContextVar("bertology_gates", default=None)


@contextmanager
def gating(values: torch.Tensor, replacement: Sequence[torch.Tensor] | None = None) -> Iterator[HeadGates]:
    """Apply head gates ``values`` ([layers, heads] or [batch, layers, heads]) with ``replacement`` (per
    layer, what gate 0 puts in a head's place; ``None``: zero; see :class:`HeadGates`) to every forward pass
    made in this context (this thread / task) until the block ends, on every model whose output projections
    carry the gate hook (:func:`~bertology.models.sites.hook_gates`)."""
    gates = HeadGates(values, replacement)
    token = _gates.set(gates)
    try:
        yield gates
    finally:
        _gates.reset(token)


class GateHeads:
    """Hook on the input of one layer's output projection (put there by
    :func:`bertology.models.sites.hook_gates`): while gates are active in this context, the heads' outputs
    entering it are multiplied by their gates (looked up by the ``attention`` module's :data:`KEPT_HEADS`
    once pruned). Outside :func:`gating` it returns at once."""

    def __init__(self, attention: torch.nn.Module, head_dim: int) -> None:
        self.attention = attention
        self.head_dim = head_dim

    def __call__(
        self, projection: torch.nn.Module, args: tuple[torch.Tensor, ...], kwargs: dict[str, Any], _: None
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]] | None:
        gates = _gates.get()
        if gates is None:
            return None
        kept = getattr(self.attention, KEPT_HEADS, None)
        return (gates.apply(args[0], kept, self.head_dim), *args[1:]), kwargs


def start_of_pass(*_: object) -> None:
    """Hook on the input of a model's base model (:func:`bertology.models.sites.hook_gates`): a forward pass
    starts at layer 0 of the active gates."""
    gates = _gates.get()
    if gates is not None:
        gates.next_layer = 0


def _is_berts(function: Callable[..., object] | None) -> bool:
    """True for an ``eager_attention_forward`` that is BERT's line for line (the same bytecode, constants
    and names): softmax(q·k·scaling + mask), dropout, times v. Many modeling files carry a copy (RoBERTa,
    ELECTRA, CamemBERT, ERNIE, MobileBERT, GTE, ...)."""
    code, bert = getattr(function, "__code__", None), _bert_eager.__code__
    return code is not None and (code.co_code, code.co_consts, code.co_names) == (
        bert.co_code,
        bert.co_consts,
        bert.co_names,
    )


def _bert_style_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float,
    dropout: float,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's eager attention with fewer passes over the ``[batch, heads, q, k]`` scores: the scaling is
    applied to the query (a quarter of the scores' size at 32 dimensions and 128 tokens), the mask is
    added in place and, unless gradients are needed, the softmax is taken in place. The probabilities
    equal eager's to float rounding (tested against eager models)."""
    scores = torch.matmul(query * scaling, key.transpose(2, 3))
    if attention_mask is not None:
        scores.add_(attention_mask)
    # Without autograd the softmax overwrites the scores: no second [batch, heads, q, k] buffer to allocate
    # and fault in (benchmarks/RESULTS.md, "Third round": 3.4 ms against 4 to 28 ms per layer on CPU).
    probs = (
        torch.nn.functional.softmax(scores, dim=-1)
        if scores.requires_grad
        else torch.softmax(scores, dim=-1, out=scores)
    )
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


#: Per modeling file (module name), the eager attention its attention modules run, found on first use.
_EAGER_BY_FILE: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def _eager_for(module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The eager attention of the modeling file that defines ``module`` (where it is BERT's: the faster
    :func:`_bert_style_attention`); one dictionary lookup after the first call."""
    defined_in = type(module).__module__
    eager = _EAGER_BY_FILE.get(defined_in)
    if eager is None:
        own = getattr(sys.modules[defined_in], "eager_attention_forward", None)
        eager = _bert_style_attention if own is None or _is_berts(own) else own
        _EAGER_BY_FILE[defined_in] = eager
    return eager


def capture_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention that also records into the active recorder (head gates act after it, where the
    output enters the layer's output projection: :func:`~bertology.models.sites.hook_gates`).

    query, key, value: [batch, heads, tokens, head_dim]; attention_mask: additive [batch, 1, q, k].
    Returns (output [batch, tokens, heads, head_dim], probs [batch, heads, q, k]) like eager; while a
    recording with an :class:`AttentionOverride` is active, what the override returns.
    """
    effective_scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    recorder = _active.get()
    if recorder is not None and recorder.override is not None:
        last = recorder.seen + 1 == recorder.stop_after
        result = recorder.override.attend(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=effective_scaling,
            dropout=dropout,
            last=last,
            **kwargs,
        )
        recorder.count_call()
        return result
    output, probs = _eager_for(module)(
        module, query, key, value, attention_mask, scaling=effective_scaling, dropout=dropout, **kwargs
    )
    if recorder is not None:
        recorder.record(probs, query, key, value, effective_scaling)
    return output, probs


def capture_mask(**kwargs: Any) -> torch.Tensor | None:
    """The attention masks of a forward pass (transformers calls it once per kind of mask: full, sliding
    window, ...): eager's additive masks, or, while a recording with an :class:`AttentionOverride` is
    active in this context, the override's."""
    recorder = _active.get()
    if recorder is not None and recorder.override is not None:
        return recorder.override.mask(**kwargs)
    return eager_mask(**kwargs)


AttentionInterface.register(IMPLEMENTATION, capture_attention)
AttentionMaskInterface.register(IMPLEMENTATION, capture_mask)


def route_attention_through_capture(model: PreTrainedModel) -> None:
    """Make ``model`` (loaded with eager attention, its layers calling transformers'
    ``AttentionInterface``) call :func:`capture_attention` in every layer."""
    model.set_attn_implementation(IMPLEMENTATION)
