"""Naming attention heads: a selection of ``(layer, head)`` pairs (0-based), checked against a model's size,
and the one printed name of a head, ``"layer-head"`` (0-based: ``"23-3"``), used by every report, table,
command's output and the web app.

Head gates, single-head ablation, pruning curves and structural pruning all take heads this way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from bertology.errors import BertologyError

#: Heads to act on: ``{layer: [head, ...]}`` or an iterable of ``(layer, head)`` pairs (0-based).
HeadSelection = Mapping[int, Iterable[int]] | Iterable[tuple[int, int]]


def head_name(layer: int, head: int) -> str:
    """``"layer-head"``, 0-based: a head's name wherever one is printed."""
    return f"{layer}-{head}"


def head_columns(
    rows: int, heads: int, stacks: Sequence[tuple[str, int]] | None = None
) -> dict[str, np.ndarray]:
    """The columns that name one row per head of a ``[rows, heads]`` table, row-major: ``layer`` and
    ``head`` (0-based), and for an encoder-decoder's gate rows ``stacks`` (each row's ``(stack, layer)``)
    ``stack``, ``layer`` (in its stack) and ``head``."""
    row, head = np.divmod(np.arange(rows * heads), heads)
    if stacks is None:
        return {"layer": row, "head": head}
    return {
        "stack": np.array([stacks[index][0] for index in row]),
        "layer": np.array([stacks[index][1] for index in row]),
        "head": head,
    }


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
