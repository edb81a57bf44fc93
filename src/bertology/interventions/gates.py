"""Head gates: multiply any heads' outputs (before the output projection) by a factor, in a ``with`` block.

```python
with head_gates(loaded, {(2, 3), (5, 0)}):        # switch off heads (2, 3) and (5, 0)
    logits = predict_logits(loaded, texts)
gates = torch.ones(loaded.num_layers, loaded.num_heads, requires_grad=True)
with head_gates(loaded, gates):                    # differentiable: importance = |dL / d gates|
    loss = ...
with head_gates(loaded, {(2, 3)}, replacement=record_head_outputs(loaded, other_inputs)):
    logits = loaded.model(**inputs).logits         # head (2, 3) takes its output on other_inputs
```

A gate of 1 changes nothing; 0 removes the head (Michel et al. 2019's mask ``ξ_h``). Gates act only in
the current thread / task and only inside the block (see :func:`bertology.models.hook.gating`), where the
heads' outputs enter each layer's output projection, for every encoder type :mod:`bertology.models.anatomy`
describes (whichever route captures its attention).

An encoder-decoder's gates have one row per layer of each stack (:func:`~bertology.models.anatomy.gate_rows`:
the encoder's layers, then the decoder's self-attention, then its cross-attention, so row ``E + D + 1`` of
a model of ``E`` encoder and ``D`` decoder layers is cross-attention's layer 1), ``loaded.gate_layers``
rows in all; :func:`stack_row` finds a row. They act on forward passes that run the encoder and the decoder
(a source and a target, teacher forced), whose attention calls come in the order of
:func:`~bertology.models.anatomy.attention_calls`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from bertology.errors import BertologyError
from bertology.models.anatomy import attention_calls, gate_rows, gated_parts, has_stacks
from bertology.models.heads import HeadSelection, heads_by_layer
from bertology.models.hook import HeadGates, gating
from bertology.models.loading import LoadedModel
from bertology.models.sites import hook_gates, recording, stacked_name


def gate_values(loaded: LoadedModel, gates: torch.Tensor | HeadSelection) -> torch.Tensor:
    """Gates as a tensor: ``[layers, heads]`` (or ``[batch, layers, heads]``) as given, or ones with zeros
    at the selected heads.

    Raises:
        BertologyError: a tensor of the wrong shape, or a head outside the model.
    """
    shape = (loaded.gate_layers, loaded.num_heads)
    if isinstance(gates, torch.Tensor):
        if tuple(gates.shape[-2:]) != shape or gates.dim() not in (2, 3):
            raise BertologyError(
                f"Gates must be [layers, heads] = {list(shape)} (or [batch, {shape[0]}, {shape[1]}]), "
                f"not {list(gates.shape)}."
            )
        return gates
    values = torch.ones(shape)
    for layer, heads in heads_by_layer(gates, *shape).items():
        values[layer, heads] = 0.0
    return values


@contextmanager
def gated(
    loaded: LoadedModel, values: torch.Tensor, replacement: Sequence[torch.Tensor] | None = None
) -> Iterator[HeadGates]:
    """Run ``loaded`` with head gates ``values`` (a tensor, see :class:`~bertology.models.hook.HeadGates`) and
    ``replacement`` (per layer, what gate 0 puts in a head's place; ``None``: zero) inside the block, its
    output projections hooked first (:func:`~bertology.models.sites.hook_gates`).

    Raises:
        BertologyError: a model type whose layers and projections bertology does not know.
    """
    hook_gates(loaded.model)
    if replacement is not None:
        replacement = [values.to(loaded.device) for values in replacement]
    if has_stacks(loaded.model):  # rows by stack, the hooks count the calls: rows in call order
        order = [gate_rows(loaded.model).index(call) for call in attention_calls(loaded.model)]
        values = values[..., order, :]
        replacement = None if replacement is None else [replacement[row] for row in order]
    with gating(values.to(loaded.device), replacement) as active:
        yield active


def row_stacks(loaded: LoadedModel) -> list[tuple[str, int]] | None:
    """An encoder-decoder's ``(stack, layer)`` of each gate row, else ``None`` (a row is a layer)."""
    return gate_rows(loaded.model) if has_stacks(loaded.model) else None


def stack_row(loaded: LoadedModel, stack: str, layer: int) -> int:
    """The gate row of an encoder-decoder's ``layer`` of ``stack`` (``"encoder"``, ``"decoder"``,
    ``"cross"``).

    Raises:
        BertologyError: a model without stacks, or a stack or layer it does not have.
    """
    if not has_stacks(loaded.model):
        raise BertologyError(f"'{loaded.name}' is not an encoder-decoder: its heads have no stack.")
    rows = gate_rows(loaded.model)
    if (stack, layer) not in rows:
        layers = sum(row[0] == stack for row in rows)
        raise BertologyError(
            f"There is no {stack} layer {layer}: the stacks are encoder, decoder and cross, the {stack} "
            f"stack has layers 0 to {layers - 1}."
            if layers
            else f"There is no stack {stack!r}; the stacks are encoder, decoder and cross."
        )
    return rows.index((stack, layer))


@contextmanager
def head_gates(
    loaded: LoadedModel,
    gates: torch.Tensor | HeadSelection,
    replacement: Sequence[torch.Tensor] | None = None,
) -> Iterator[HeadGates]:
    """Run ``loaded`` with its heads' outputs multiplied by ``gates`` inside the block.

    gates: ``[layers, heads]`` multipliers, ``[batch, layers, heads]`` (one row per input of every batch run
        inside), or a :data:`~bertology.models.heads.HeadSelection` of heads to switch off (gate 0, the others
        1). A tensor that requires grad gets gradients through every forward pass made inside.
    replacement: per layer, ``[batch or 1, tokens or 1, heads * head_dim]``, what each head's output moves
        towards as its gate goes to 0 (``gate * output + (1 - gate) * replacement``; e.g. from
        :func:`record_head_outputs` of another input), or ``None`` for zero (plain multiplication).
    """
    with gated(loaded, gate_values(loaded, gates), replacement) as active:
        yield active


def record_head_outputs(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Run ``loaded`` once on ``inputs`` and return, per layer (an encoder-decoder's: per gate row), its
    heads' outputs where they enter the
    output projection: ``[batch, tokens, heads * head_dim]``, head ``h`` in features ``h * head_dim ..
    (h + 1) * head_dim - 1`` (the site the gates act on; after any gates active in this context). Runs as
    the caller's context says (no gradients inside ``torch.inference_mode``); the tensors stay on the
    model's device. ALBERT's shared projection gives one entry per layer call, in layer order.

    Raises:
        BertologyError: a model type whose layers and projections bertology does not know.
    """
    parts = gated_parts(loaded.model)
    hook_gates(loaded.model)
    if has_stacks(loaded.model):
        keys = [(stacked_name(stack, "z"), layer) for stack, layer in gate_rows(loaded.model)]
    else:
        keys = [("z", layer) for layer in range(len(parts))]
    with recording(
        loaded.model, [name for name in dict.fromkeys(name for name, _ in keys)], detach=False
    ) as cache:
        loaded.model(**inputs)
    outputs = [cache[key].flatten(-2) for key in keys if key in cache]
    if len(outputs) != len(parts):
        raise RuntimeError(f"Expected {len(parts)} output projection calls in one pass, saw {len(outputs)}.")
    return outputs
