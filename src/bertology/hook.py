"""The attention call of every layer: where bertology records attention and gates heads.

One of the few modules that touch model internals (with :mod:`bertology.anatomy`, which knows where each
architecture keeps its layers and projections, and the modules that use it).

transformers 5 sends every attention call through a function looked up by name in its
``AttentionInterface``. We register one, ``"bertology"``, that runs the model's own eager attention
(its ``eager_attention_forward``; for BERT-style models the same computation in fewer passes, equal to
float rounding) and, while a :class:`Recorder` is active in the current context, keeps what it
computed. Outside a recording it only computes.
A ``ContextVar`` holds the active recorder, so threads (e.g. concurrent web requests) never mix records.

The same function applies head gates: while :func:`gating` is active, each head's output (before the
layer's output projection) is multiplied by its gate. transformers gives the attention function no
layer index (ALBERT even shares one attention module between all layers), so the gates count the calls:
in an encoder every forward pass makes exactly one attention call per layer, in layer order. The count
starts again at layer 0 whenever a forward pass of the model starts (a forward pre-hook that
:func:`route_attention_through_capture` puts on the model), so a pass cut short (an exception inside
a layer, a recording that stops after the last attention) never shifts the passes after it.
A ``ContextVar`` holds the active gates too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.bert.modeling_bert import eager_attention_forward as _bert_eager

IMPLEMENTATION = "bertology"


@dataclass
class AttentionCall:
    """What one attention layer computed for a padded batch.

    probs: [batch, heads, query, key], softmax output (rows sum to 1 over unmasked keys).
    query, key: [batch, heads, tokens, head_dim] before scaling, or ``None`` when not requested.
    scaling: the factor applied to q·k before the mask and softmax (1/sqrt(head_dim) for BERT).
    """

    probs: torch.Tensor
    query: torch.Tensor | None
    key: torch.Tensor | None
    scaling: float


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
        (e.g. :class:`bertology.norms.NormWeighting`).
    stop_after: if set, the forward pass is cut short once this many calls are recorded (the model's
        layers): what follows the last attention (that layer's feed-forward block, the pooler, a task
        head) does not change any attention, so a caller that reads only attention skips it.
        :func:`recording` ends the pass quietly; the model's output is then never computed.
    """

    keep_qk: bool = False
    consume: Callable[[torch.Tensor], None] | None = None
    keep_graph: bool = False
    weighting: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    stop_after: int | None = None
    calls: list[AttentionCall] = field(default_factory=list)
    seen: int = 0

    def record(
        self, probs: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
    ) -> None:
        if self.weighting is not None:
            probs = self.weighting(self.seen, probs.detach(), value.detach())
        self.seen += 1
        if self.consume is not None:
            self.consume(probs.detach())
        else:
            keep = self.keep_qk
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


@contextmanager
def recording(
    keep_qk: bool = False,
    consume: Callable[[torch.Tensor], None] | None = None,
    keep_graph: bool = False,
    weighting: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    stop_after: int | None = None,
) -> Iterator[Recorder]:
    """Record every attention call made in this context (this thread / task) until the block ends
    (``consume``: stream each layer's probs to it instead; ``keep_graph``: keep them differentiable;
    ``weighting``: record other weights than the softmax output; ``stop_after``: cut the forward pass
    short after that many calls, and end the block there without an error; see :class:`Recorder`)."""
    recorder = Recorder(
        keep_qk=keep_qk, consume=consume, keep_graph=keep_graph, weighting=weighting, stop_after=stop_after
    )
    token = _active.set(recorder)
    try:
        yield recorder
    except _AllLayersRecorded:
        pass
    finally:
        _active.reset(token)


#: Attribute of an attention module whose heads were structurally pruned: the original indices of the
#: heads it still computes, in order (gates are looked up by these).
KEPT_HEADS = "bertology_kept_heads"


@dataclass
class HeadGates:
    """Multipliers on each head's output, applied before the layer's output projection.

    values: [layers, heads] (one gate per head) or [batch, layers, heads] (one per input of the batch,
        e.g. for per-example gradients); 1 leaves a head as it is, 0 removes it. May require grad.
        Layer ``i`` of ``values`` gates the ``i``-th attention call of a forward pass; code that runs
        layers ``l..`` of a model by itself gates them with ``values[..., l:, :]`` in a block of its own.
    next_layer: the layer of the next attention call: 0 when a forward pass starts, one more after
        each call.
    """

    values: torch.Tensor
    next_layer: int = 0

    @property
    def num_layers(self) -> int:
        return self.values.shape[-2]

    def apply(self, module: torch.nn.Module, output: torch.Tensor) -> torch.Tensor:
        """``output`` [batch, tokens, heads, head_dim] of one attention call, times its layer's gates."""
        layer = self.next_layer
        if layer >= self.num_layers:
            raise RuntimeError(
                f"Head gates for {self.num_layers} layers saw more attention calls than that in one forward "
                "pass; gate a model loaded with bertology.load_model or wrap_model."
            )
        self.next_layer = layer + 1
        gates = self.values[..., layer, :]
        kept = getattr(module, KEPT_HEADS, None)
        if kept is not None:
            gates = gates[..., kept]
        if gates.shape[-1] != output.shape[2]:
            raise ValueError(
                f"Layer {layer} has {output.shape[2]} heads but {gates.shape[-1]} gates were given."
            )
        shape = (1, 1, -1, 1) if gates.dim() == 1 else (gates.shape[0], 1, -1, 1)
        return output * gates.reshape(shape).to(output.dtype)


_gates: ContextVar[HeadGates | None] = ContextVar("bertology_gates", default=None)


@contextmanager
def gating(values: torch.Tensor) -> Iterator[HeadGates]:
    """Apply head gates ``values`` ([layers, heads] or [batch, layers, heads], see :class:`HeadGates`) to
    every attention call made in this context (this thread / task) until the block ends."""
    gates = HeadGates(values)
    token = _gates.set(gates)
    try:
        yield gates
    finally:
        _gates.reset(token)


#: Modeling files whose ``eager_attention_forward`` is BERT's, line for line: softmax(q·kᵀ·scaling +
#: mask), dropout, times v. Their attention runs as :func:`_bert_style_attention`.
_BERT_STYLE_MODULES = frozenset(
    f"transformers.models.{name}.modeling_{name}"
    for name in ("bert", "roberta", "xlm_roberta", "albert", "distilbert", "electra")
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


def _eager_for(module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The eager attention of the modeling file that defines ``module`` (BERT-style ones: the faster
    :func:`_bert_style_attention`)."""
    defined_in = type(module).__module__
    if defined_in in _BERT_STYLE_MODULES:
        return _bert_style_attention
    return getattr(sys.modules[defined_in], "eager_attention_forward", _bert_eager)


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
    """Eager attention that also records into the active recorder and applies the active head gates.

    query, key, value: [batch, heads, tokens, head_dim]; attention_mask: additive [batch, 1, q, k].
    Returns (output [batch, tokens, heads, head_dim], probs [batch, heads, q, k]) like eager.
    """
    effective_scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    output, probs = _eager_for(module)(
        module, query, key, value, attention_mask, scaling=effective_scaling, dropout=dropout, **kwargs
    )
    recorder = _active.get()
    if recorder is not None:
        recorder.record(probs, query, key, value, effective_scaling)
    gates = _gates.get()
    if gates is not None:
        output = gates.apply(module, output)
    return output, probs


AttentionInterface.register(IMPLEMENTATION, capture_attention)
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def _start_of_pass(module: torch.nn.Module, args: tuple[object, ...]) -> None:
    """Forward pre-hook of a routed model: a forward pass starts at layer 0 of the active gates."""
    gates = _gates.get()
    if gates is not None:
        gates.next_layer = 0


#: Attribute set on a model's base model once :func:`_start_of_pass` is registered on it.
_PASS_HOOKED = "bertology_pass_hooked"


def route_attention_through_capture(model: PreTrainedModel) -> None:
    """Make ``model`` (loaded with eager attention) call :func:`capture_attention` in every layer, with the
    gate count starting again at every forward pass of its base model (the one every task head calls)."""
    model.set_attn_implementation(IMPLEMENTATION)
    base = model.base_model
    if not getattr(base, _PASS_HOOKED, False):
        base.register_forward_pre_hook(_start_of_pass)
        setattr(base, _PASS_HOOKED, True)
