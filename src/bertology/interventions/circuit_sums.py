"""How a masked pass (:mod:`~bertology.interventions.circuit_pass`) sums a layer's absent in-edges: the
weights of each distinct pattern of in-edges among the layer's backward nodes, and the product that sums
them (sparse where few weights are not 0; several layers' dense products as one)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertology.interventions.circuit_graph import CircuitGraph

#: The share of non-zero weights under which a masked pass sums the differences by a sparse matrix product
#: (``benchmarks/bench_circuit_sums.py``, one CPU thread, 16 columns of 301 rows of 145,152 floats: 2.5 times
#: faster than a dense one at 2 %, 1.2 times at 10 %, slower from 15 %).
SPARSE_BELOW = 0.12


#: How many consecutive layers a masked pass sums together where their sums are dense products
#: (``benchmarks/bench_circuit_sums.py``: 3 layers' 48 columns at 27 to 29 GMAC/s, one layer's 16 at 18 to 20,
#: 4 layers' at 23).
BLOCK_LAYERS = 3


@dataclass(frozen=True)
class EdgeWeights:
    """How a masked pass sums one layer's absent in-edges from its first ``rows`` forward nodes: one
    column per distinct pattern of in-edges among the layer's nodes, ``which`` the column of each node
    (from the layer's first), ``weights`` [distinct, rows] the edges summed (its absent ones, or, where
    they are more than its kept ones, the kept ones, ``from_total`` set: the sum is then the running
    total less theirs)."""

    rows: int
    weights: torch.Tensor
    from_total: list[int]
    which: list[int]


def is_sparse(weights: torch.Tensor) -> bool:
    """Whether a masked pass sums with ``weights`` by a sparse product (:data:`SPARSE_BELOW`)."""
    return int(weights.count_nonzero()) < SPARSE_BELOW * weights.numel()


def dense_blocks(plans: dict[int, EdgeWeights]) -> dict[int, list[int]]:
    """The blocks of a planned masked pass: by first layer, up to :data:`BLOCK_LAYERS` consecutive layers
    whose sums are dense products, summed together over the rows the first one reads."""
    blocks: dict[int, list[int]] = {}
    block: list[int] = []
    for layer in sorted(plans):
        dense = not is_sparse(plans[layer].weights)
        if block and dense and layer == block[-1] + 1 and len(block) < BLOCK_LAYERS:
            block.append(layer)
            continue
        if len(block) > 1:
            blocks[block[0]] = block
        block = [layer] if dense else []
    if len(block) > 1:
        blocks[block[0]] = block
    return blocks


def own_weights(absent: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """How a masked pass sums an MLP's in-edges from its own layer's heads, ``absent`` [heads] (1: absent):
    (the weights of the heads' differences, whether the sum is the heads' whole difference less theirs):
    the absent edges, or the kept ones where they are fewer."""
    if float(absent.sum()) * 2 > len(absent):
        return 1 - absent, True
    return absent, False


def edge_weights(graph: CircuitGraph, absent: torch.Tensor, nodes: slice, rows: int) -> EdgeWeights:
    """The :class:`EdgeWeights` of backward ``nodes`` over the first ``rows`` forward nodes, ``absent``
    [forward nodes, backward nodes] (1: the edge is absent)."""
    real = torch.as_tensor(graph.real[:rows, nodes], device=absent.device)
    # per edge 0: none, 1: kept, 2: absent; one column per distinct pattern
    patterns, which = torch.unique(real.float() + absent[:rows, nodes], dim=1, return_inverse=True)
    present, kept = (patterns == 2).float(), (patterns == 1).float()
    few_absent = present.sum(0) <= kept.sum(0)
    weights = torch.where(few_absent, present, kept).T
    return EdgeWeights(rows, weights, (~few_absent).nonzero()[:, 0].tolist(), which.tolist())


def weighted_sum(weights: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[columns, n] ``weights`` [columns, rows] times ``rows`` [rows, n] (some forward nodes' differences,
    finite numbers where a weight is 0): a sparse product where under :data:`SPARSE_BELOW` of the weights
    are not 0, else a dense one over every row or, where fewer than half weigh anything, over a copy of
    those (a row read by the product costs about what a row copied does)."""
    if is_sparse(weights):
        return torch.sparse.mm(weights.to_sparse(), rows)
    weighing = weights.any(0).nonzero()[:, 0]
    if len(weighing) < weights.shape[1] // 2:
        weights, rows = weights.index_select(1, weighing), rows.index_select(0, weighing)
    return weights @ rows
