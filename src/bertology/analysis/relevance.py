"""Attention rollout and attention flow for one input (Abnar and Zuidema 2020, "Quantifying Attention
Flow in Transformers").

Both start from the residual-augmented attention of each layer: ``A_l`` = mean over heads of the
attention ``[n, n]``, ``Â_l = 0.5 A_l + 0.5 I`` with rows renormalised (they already sum to 1, so the
renormalisation only removes float drift). Layers are 0-based here: ``Â_0`` is the first layer's.

- **Rollout**: ``R_l = Â_l Â_{l-1} ... Â_0``; ``R_l[i, j]`` is how much token ``i`` at the output of
  layer ``l`` is made of input token ``j``. Rows sum to 1.
- **Flow**: a DAG with ``(layers + 1) x n`` nodes, node ``(l, i)`` = token ``i`` at the output of layer
  ``l - 1`` (``l = 0``: the input embeddings), and an edge ``(l + 1, i) -> (l, k)`` of capacity
  ``Â_l[i, k]``. ``F_l[i, j]`` = the maximum flow from node ``(l + 1, i)`` to input node ``(0, j)``.
  Each value lies between ``R_l[i, j]`` (the rollout's random walk, counted on the edges of its paths
  that end at ``j``, is a feasible flow) and 1 (the source's edges carry 1 in all). Rows are not
  normalised and may sum to more than 1, since the flows to different input tokens share capacity; the
  authors normalise rows for display, and so does the view.

Computing flow: one maximum flow per ``(layer, token, input token)``, ``layers x n^2`` in all, as the
published code does, but each on the smallest graph that has the same value:

- layer 0: the only path is one edge, so ``F_0 = Â_0`` (exact; flow equals rollout here);
- layer 1: the paths ``(2, i) -> (1, k) -> (0, j)`` share no edge, so ``F_1[i, j] = sum_k min(Â_1[i, k],
  Â_0[k, j])`` (exact, computed in one array operation);
- layer ``l >= 2``: Dinic's algorithm, ``scipy.sparse.csgraph.maximum_flow`` (compiled, maintained with
  SciPy; networkx's max-flow algorithms are pure Python: the published per-pair Edmonds-Karp on the
  whole networkx graph is 500 to 1,800 times slower, ``benchmarks/bench_relevance.py``), on a
  graph holding only what can carry flow from source to sink: the source, the ``l`` layers of ``n``
  nodes between, the sink (nodes above the source and the other ``n - 1`` input nodes are dead ends),
  and no edge of capacity 0. The graph is built once per layer; only the source's and the sink's
  capacities change from pair to pair.

Complexity: a layer-``l`` pair (``l >= 2``) solves max-flow on ``V = l n + 2`` nodes and
``E = (l - 1) n^2 + 2n`` edges. Dinic's bound is ``O(V^2 E) = O(l^3 n^4)`` per pair; SciPy also spends
``O(E)`` per call adding reverse edges, and in practice a pair costs a small multiple of ``E`` (0.6 ms on
average at 64 tokens and 6 layers). All ``L n^2`` pairs of ``L`` layers: ``O(L^2 n^4)`` in practice,
``O(L^4 n^6)`` by Dinic's bound; memory ``O(L n^2)``. Measured on one core (CPU time, all-MiniLM-L6-v2,
6 layers; ``benchmarks/bench_relevance.py``, RESULTS.md): 1.2 s at 32 tokens, 9.7 s at 64, 130 s at 128.
Hence the length limit :data:`FLOW_MAX_TOKENS` = 64, which :func:`attention_flow` enforces.

Precision: SciPy's max-flow needs integer capacities, so flow layers use ``round(Â * FLOW_SCALE)`` with
``FLOW_SCALE = 2**30`` (int32 capacities; a source's total stays below ``2**31``). Each capacity moves by
at most ``1 / (2 FLOW_SCALE)``, and a max-flow value equals a min-cut value, so it moves by at most
(edges in the cut) ``/ (2 FLOW_SCALE) <= E / 2**31`` (:func:`flow_error_bound`): ``7.7e-6`` for 6 layers
at 64 tokens, ``3.1e-5`` at 128, ``1.7e-4`` for 24 layers at 128 (float32 attention itself carries
about ``1e-7`` relative error). Layers 0 and 1 are exact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow

from bertology.errors import BertologyError
from bertology.options import FLOW_MAX_TOKENS
from bertology.progress import Progress

if TYPE_CHECKING:
    from bertology.attention.capturing import Attention

RelevanceMethod = Literal["rollout", "flow"]
RELEVANCE_METHODS: tuple[RelevanceMethod, ...] = ("rollout", "flow")
#: Keys of the JSON object :meth:`Relevance.to_json` writes that mark a file as its output (so a later run
#: may replace it).
JSON_MARKS = ("model", "tokens", "formula", "attention")

#: Integer scale of the capacities given to the max-flow solver (see the module docstring for the error).
FLOW_SCALE = 2**30


def residual_attention(probs: np.ndarray) -> np.ndarray:
    """``Â: [layers, n, n]`` float64: head-mean attention plus the residual, ``0.5 A + 0.5 I``, rows
    renormalised to sum to 1.

    probs: [layers, heads, n, n], rows (query tokens) summing to 1.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 4 or probs.shape[-1] != probs.shape[-2]:
        raise BertologyError(f"Expected attention of shape [layers, heads, n, n], got {list(probs.shape)}.")
    mixed = 0.5 * probs.mean(axis=1) + 0.5 * np.eye(probs.shape[-1])
    return mixed / mixed.sum(axis=-1, keepdims=True)


def attention_rollout(probs: np.ndarray) -> np.ndarray:
    """``R: [layers, n, n]`` float64, ``R_l = Â_l Â_{l-1} ... Â_0``: row ``i`` of layer ``l`` is how much
    token ``i`` at that layer's output draws on each input token; rows sum to 1.

    probs: [layers, heads, n, n] attention of one input (see :func:`residual_attention`).
    """
    augmented = residual_attention(probs)
    rollout = np.empty_like(augmented)
    product = np.eye(augmented.shape[-1])
    for layer, matrix in enumerate(augmented):
        product = matrix @ product
        rollout[layer] = product
    return rollout


def flow_pair_count(num_layers: int, n: int) -> int:
    """How many max-flow problems :func:`attention_flow` solves: ``n^2`` per layer from the third on."""
    return max(num_layers - 2, 0) * n * n


def flow_error_bound(num_layers: int, n: int) -> float:
    """Largest error of any :func:`attention_flow` value from rounding capacities: ``E / (2 FLOW_SCALE)``
    for the largest graph solved, ``E = (num_layers - 2) n^2 + 2n`` edges (0 when none is solved)."""
    if num_layers < 3:
        return 0.0
    return ((num_layers - 2) * n * n + 2 * n) / (2 * FLOW_SCALE)


def check_flow_length(n: int, num_layers: int, max_tokens: int = FLOW_MAX_TOKENS) -> None:
    """Raise :class:`BertologyError` when attention flow would refuse ``n`` tokens."""
    if n > max_tokens:
        raise BertologyError(
            f"Attention flow is limited to {max_tokens} tokens and this input has {n}: it solves "
            f"{flow_pair_count(num_layers, n):,} max-flow problems here and its time grows about as n^4, "
            "so shorten the input, raise the limit (max_tokens, --max-tokens) or use attention rollout."
        )


class _LayerGraph:
    """The flow graph from one token at layer ``top``'s output down to one input token, in CSR form.

    capacities: [layers, n, n] int32 scaled ``Â``; the graph uses ``Â_1 .. Â_{top-1}`` between its layers.
    Nodes: 0 = the source; then ``top`` layers of ``n`` nodes, from layer ``top - 1``'s output down to
    layer 0's; last = the sink (one input token). Every row's columns ascend (what SciPy needs). The
    source's ``n`` edges come first in ``data`` and each lowest-layer node has only its sink edge, so one
    pair differs from the next only in those ``2n`` capacities, written in place.
    """

    def __init__(self, capacities: np.ndarray, top: int) -> None:
        n = capacities.shape[-1]
        self.n = n
        self.sink = top * n + 1
        columns: list[np.ndarray] = [np.arange(1, n + 1)]  # source -> layer top-1's nodes
        counts: list[np.ndarray] = [np.array([n])]
        data: list[np.ndarray] = [np.zeros(n, np.int32)]
        for layer in range(top - 1, 0, -1):  # (layer+1, i) -> (layer, k), capacity Â_layer[i, k]
            first_target = (top - layer) * n + 1
            block = capacities[layer]
            kept = block > 0
            columns.extend(first_target + np.nonzero(row)[0] for row in kept)
            counts.append(kept.sum(axis=1))
            data.append(block[kept])
        columns.append(np.full(n, self.sink))  # lowest-layer nodes -> sink, one edge each
        counts.append(np.ones(n, dtype=np.int64))
        data.append(np.zeros(n, np.int32))
        counts.append(np.array([0]))  # the sink's row: no edges
        indptr = np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int32)
        size = self.sink + 1
        self.graph = csr_array(
            (np.concatenate(data).astype(np.int32), np.concatenate(columns).astype(np.int32), indptr),
            shape=(size, size),
        )
        self.graph.has_sorted_indices = True
        self.sink_slots = indptr[self.sink - n : self.sink]

    def max_flow(self, source_capacities: np.ndarray, sink_capacities: np.ndarray) -> int:
        """Max-flow value with the source's edges ``[n]`` and the sink's incoming edges ``[n]`` set."""
        self.graph.data[: self.n] = source_capacities
        self.graph.data[self.sink_slots] = sink_capacities
        return int(maximum_flow(self.graph, 0, self.sink).flow_value)


def attention_flow(
    probs: np.ndarray,
    *,
    max_tokens: int = FLOW_MAX_TOKENS,
    on_progress: Progress | None = None,
) -> np.ndarray:
    """``F: [layers, n, n]`` float64: ``F_l[i, j]`` = maximum flow from token ``i`` at layer ``l``'s
    output to input token ``j`` through the residual-augmented attention graph (see the module docstring
    for the graph and the complexity). Values lie in [0, 1] (to within :func:`flow_error_bound`, the
    rounding error) and are at least the rollout's; rows are not normalised.

    probs: [layers, heads, n, n] attention of one input.
    max_tokens: refuse (:class:`BertologyError`) inputs longer than this.
    on_progress: told the max-flow problems solved so far, out of :func:`flow_pair_count`.
    """
    augmented = residual_attention(probs)
    layers, n, _ = augmented.shape
    check_flow_length(n, layers, max_tokens)
    flow = np.empty_like(augmented)
    flow[0] = augmented[0]
    if layers > 1:
        flow[1] = np.minimum(augmented[1][:, :, None], augmented[0][None, :, :]).sum(axis=1)
    capacities = np.rint(augmented * FLOW_SCALE).astype(np.int32)
    solved, problems = 0, flow_pair_count(layers, n)
    for layer in range(2, layers):
        graph = _LayerGraph(capacities[:layer], top=layer)
        for sink in range(n):
            for token in range(n):
                value = graph.max_flow(capacities[layer, token], capacities[0, :, sink])
                flow[layer, token, sink] = value / FLOW_SCALE
            solved += n
            if on_progress is not None:
                on_progress(solved, problems)
    return flow


def normalise_rows(values: np.ndarray) -> np.ndarray:
    """``values`` [..., n] with each row divided by its sum (rows summing to 0 stay 0), for display."""
    totals = values.sum(axis=-1, keepdims=True)
    return np.divide(values, totals, out=np.zeros_like(values, dtype=np.float64), where=totals > 0)


def _rounded(values: np.ndarray) -> list:
    """Nested lists of ``values`` rounded to 8 decimals (float32 noise is larger than that)."""
    return np.asarray(values, dtype=np.float64).round(8).tolist()


@dataclass
class Relevance:
    """Rollout and / or flow of one input.

    attention: [layers, n, n] head-mean attention ``A_l`` (rows sum to 1).
    methods: {"rollout": R, "flow": F}, each [layers, n, n]: row ``i`` of layer ``l`` = token ``i`` at
        layer ``l``'s output, column ``j`` = input token ``j``. Flow rows are not normalised.
    """

    model_name: str
    tokens: list[str]
    attention: np.ndarray
    methods: dict[RelevanceMethod, np.ndarray]

    def to_json(self) -> str:
        """``{"model", "tokens", "formula", "attention", "rollout"?, "flow"?}``; each matrix a
        ``[layers][n][n]`` nested list (row = token at that layer's output, column = input token)."""
        matrices = {name: _rounded(values) for name, values in self.methods.items()}
        return json.dumps(
            {
                "model": self.model_name,
                "tokens": self.tokens,
                "formula": (
                    "Abnar and Zuidema 2020; residual attention 0.5 * head mean + 0.5 * I, rows "
                    "renormalised; rollout rows sum to 1; flow = max-flow value, rows not normalised"
                ),
                "attention": _rounded(self.attention),
                **matrices,
            }
        )


def relevance(
    attention: Attention,
    methods: Sequence[RelevanceMethod] = RELEVANCE_METHODS,
    *,
    max_tokens: int = FLOW_MAX_TOKENS,
    on_progress: Progress | None = None,
) -> Relevance:
    """Rollout and / or flow of a captured input (``max_tokens`` and ``on_progress``: see
    :func:`attention_flow`)."""
    unknown = [name for name in methods if name not in RELEVANCE_METHODS]
    if unknown or not methods:
        raise BertologyError(f"Unknown relevance method {unknown or methods}; choose rollout and / or flow.")
    computed: dict[RelevanceMethod, np.ndarray] = {}
    for name in methods:
        if name == "rollout":
            computed[name] = attention_rollout(attention.probs)
        else:
            computed[name] = attention_flow(attention.probs, max_tokens=max_tokens, on_progress=on_progress)
    return Relevance(attention.model_name, attention.tokens, attention.probs.mean(axis=1), computed)
