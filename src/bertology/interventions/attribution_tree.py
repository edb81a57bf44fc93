"""The attribution tree of Hao et al. (2021), section 3.2 and Algorithm 1: the strongest token-to-token
interactions of one input, from the top layer down.

From the attribution ``Attr_h(A^l)`` ``[layers, heads, n, n]`` (:mod:`~bertology.interventions.
attention_attribution`; rows are query tokens ``i``, columns key tokens ``j``; an edge ``i -> j`` of layer
``l`` says that ``i`` took information from ``j`` there):

1. Per layer, ``S^l = Σ_h Attr_h(A^l)``, normalised by its largest entry among the query rows other than the
   first token ([CLS]): ``a^l = S^l / |max_{i≥1, j} S^l|``. An interaction is kept where ``a^l_{ij} > τ``
   (``τ = 0.4`` in the paper). A layer whose largest such entry is not positive keeps none (e.g. the last
   layer of a classifier that reads only the first token: only the [CLS] row has attribution there).
2. The root is the token (not the first) with the largest total attribution to other tokens over all
   layers: ``argmax_{i≥1} Σ_j max(0, Σ_l S^l_{ij})``, ``j ≠ i``.
3. Every token starts *absent*; the root is *present*. From the top layer down, for each kept interaction
   ``i -> j`` (``i`` from 1, then ``j`` from 0, in token order) whose query ``i`` is already in the tree and
   whose key ``j`` is absent: add the edge and make ``j`` present (it becomes a node of the tree; ``i``
   becomes *fixed*, an inner node). Interactions towards present or fixed tokens add nothing, so each token
   enters once, from the highest layer that links it, and the result is a tree.

This follows the authors' released code (``examples/attribution_tree.py``), whose three token states are
those of Algorithm 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The paper's threshold on normalised attribution.
DEFAULT_THRESHOLD = 0.4

_ABSENT, _PRESENT, _FIXED = -1, 0, 1


@dataclass(frozen=True)
class TreeEdge:
    """One edge of the tree: in ``layer`` (0-based), token ``query`` took information from token ``key``
    (positions in the input); ``score``: the normalised layer attribution ``a^layer[query, key]``."""

    layer: int
    query: int
    key: int
    score: float


@dataclass(frozen=True)
class AttributionTree:
    """root: the root's token position. edges: in the order they were added (top layer first).
    threshold: ``τ``. depth: token position -> depth in the tree (root 0), for the tokens in it."""

    root: int
    edges: list[TreeEdge]
    threshold: float

    @property
    def depth(self) -> dict[int, int]:
        depths = {self.root: 0}
        for edge in self.edges:
            depths[edge.key] = depths[edge.query] + 1
        return depths

    def to_dict(self) -> dict[str, object]:
        return {
            "root": self.root,
            "threshold": self.threshold,
            "edges": [
                {"layer": e.layer, "query": e.query, "key": e.key, "score": e.score} for e in self.edges
            ],
        }


def normalised_layers(attribution: np.ndarray) -> np.ndarray:
    """[layers, n, n] ``a^l``: each layer's attribution summed over heads, over the largest entry of its
    rows 1.. (all 0 for a layer whose largest such entry is not positive)."""
    summed = attribution.sum(axis=1).astype(np.float64)
    largest = summed[:, 1:, :].reshape(len(summed), -1).max(axis=1, initial=0.0)
    scale = np.where(largest > 0, largest, np.inf)
    return summed / scale[:, None, None]


def tree_root(attribution: np.ndarray) -> int:
    """The root token (step 2 of the module docstring); 0 for an input of one token."""
    combined = np.maximum(attribution.sum(axis=(0, 1)), 0.0)
    np.fill_diagonal(combined, 0.0)
    totals = combined.sum(axis=1)
    return 1 + int(np.argmax(totals[1:])) if len(totals) > 1 else 0


def attribution_tree(attribution: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> AttributionTree:
    """The attribution tree of ``attribution`` [layers, heads, n, n] (see the module docstring)."""
    layers = normalised_layers(attribution)
    tokens = layers.shape[-1]
    root = tree_root(attribution)
    state = np.full(tokens, _ABSENT)
    state[root] = _PRESENT
    edges: list[TreeEdge] = []
    for layer in range(len(layers) - 1, -1, -1):
        kept = layers[layer] > threshold
        for query in range(1, tokens):
            for key in range(tokens):
                if not kept[query, key] or state[query] == _ABSENT or state[key] != _ABSENT:
                    continue
                state[query], state[key] = _FIXED, _PRESENT
                edges.append(TreeEdge(layer, query, key, float(layers[layer, query, key])))
    return AttributionTree(root, edges, threshold)
