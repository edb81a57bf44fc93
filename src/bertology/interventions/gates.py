"""Head gates: multiply any heads' outputs (before the output projection) by a factor, in a ``with`` block.

```python
with head_gates(loaded, {(2, 3), (5, 0)}):        # switch off heads (2, 3) and (5, 0)
    logits = predict_logits(loaded, texts)
gates = torch.ones(loaded.num_layers, loaded.num_heads, requires_grad=True)
with head_gates(loaded, gates):                    # differentiable: importance = |dL / d gates|
    loss = ...
```

A gate of 1 changes nothing; 0 removes the head (Michel et al. 2019's mask ``ξ_h``). Gates act only in
the current thread / task and only inside the block (see :func:`bertology.hook.gating`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch

from bertology.errors import BertologyError
from bertology.hook import HeadGates, gating
from bertology.models import LoadedModel

#: Heads to switch off: ``{layer: [head, ...]}`` or an iterable of ``(layer, head)`` pairs (0-based).
HeadSelection = Mapping[int, Iterable[int]] | Iterable[tuple[int, int]]


def heads_by_layer(selection: HeadSelection, num_layers: int, num_heads: int) -> dict[int, list[int]]:
    """``selection`` as ``{layer: sorted heads}`` (layers without heads left out).

    Raises:
        BertologyError: a layer or head outside the model.
    """
    pairs = (
        [(layer, head) for layer, heads in selection.items() for head in heads]
        if isinstance(selection, Mapping)
        else list(selection)
    )
    grouped: dict[int, set[int]] = {}
    for layer, head in pairs:
        if not (0 <= int(layer) < num_layers and 0 <= int(head) < num_heads):
            raise BertologyError(
                f"There is no head ({layer}, {head}): the model has {num_layers} layers of {num_heads} heads "
                "(0-based)."
            )
        grouped.setdefault(int(layer), set()).add(int(head))
    return {layer: sorted(heads) for layer, heads in sorted(grouped.items())}


def gate_values(loaded: LoadedModel, gates: torch.Tensor | HeadSelection) -> torch.Tensor:
    """Gates as a tensor: ``[layers, heads]`` (or ``[batch, layers, heads]``) as given, or ones with zeros
    at the selected heads.

    Raises:
        BertologyError: a tensor of the wrong shape, or a head outside the model.
    """
    shape = (loaded.num_layers, loaded.num_heads)
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
def head_gates(loaded: LoadedModel, gates: torch.Tensor | HeadSelection) -> Iterator[HeadGates]:
    """Run ``loaded`` with its heads' outputs multiplied by ``gates`` inside the block.

    gates: ``[layers, heads]`` multipliers, ``[batch, layers, heads]`` (one row per input of every batch run
        inside), or a :data:`HeadSelection` of heads to switch off (gate 0, the others 1). A tensor that
        requires grad gets gradients through every forward pass made inside.
    """
    values = gate_values(loaded, gates)
    with gating(values.to(loaded.device)) as active:
        yield active
