"""The computational graph a circuit is drawn from, as the Mechanistic Interpretability Benchmark (MIB,
Mueller et al. 2025; its circuit track code github.com/hannamw/MIB-circuit-track over
github.com/hannamw/EAP-IG, ``eap/graph.py``) builds it.

Nodes that write to the residual stream (MIB's *forward* nodes), in the order a forward pass computes them:
``input`` (what enters layer 0: the embeddings), then per layer ``l`` every attention head ``a{l}.h{h}``
and the MLP ``m{l}``. Nodes that read it (MIB's *backward* nodes): per layer the query, key and value input
of every head ``a{l}.h{h}<q>``, ``<k>``, ``<v>``, the MLP ``m{l}`` and, last, ``logits``. An edge runs from
every forward node to every backward node that comes after it: a head's inputs read the nodes of earlier
layers, an MLP also the heads of its own layer, ``logits`` every node. MIB names an edge
``"{upstream}->{downstream}"``, e.g. ``a0.h1->a3.h2<q>``.

In a pre-norm model the residual stream at a node's input is exactly the sum of the upstream nodes'
outputs (plus the output projections' biases, which no node owns and no patch changes), so a node's input
can be rebuilt from its in-edges: that is what makes the graph's edges patchable one by one
(:mod:`bertology.interventions.circuit_pass`). A post-norm encoder's stream is a sum of the nodes'
contributions carried through its LayerNorms instead (:mod:`bertology.interventions.circuit_norms`); its
graph is the same, ``logits`` its classifier's.

Where this differs from MIB: with grouped-query attention (Llama 3, SmolLM2, Qwen) MIB's TransformerLens
models ungroup the keys and values (each query head gets its own copy of the key and value projections);
bertology runs the model as it is, so the key and value inputs are per key/value head:
``a{l}.h{j}<k>`` is key/value head ``j`` (shared by query heads ``j * groups .. (j + 1) * groups - 1``), and
the graph has ``layers * (heads + 2 * key_value_heads)`` head inputs where MIB has ``3 * layers * heads``.
Without grouped-query attention the graphs are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

#: The letters of a head's three inputs, in MIB's order.
QKV = ("q", "k", "v")


def head_node(layer: int, head: int) -> str:
    """MIB's name of the head ``head`` of layer ``layer`` (0-based): ``"a5.h2"``."""
    return f"a{layer}.h{head}"


def mlp_node(layer: int) -> str:
    """MIB's name of the MLP of layer ``layer`` (0-based): ``"m5"``."""
    return f"m{layer}"


@dataclass(frozen=True)
class CircuitGraph:
    """The graph of a model with ``layers`` layers of ``heads`` query heads and ``key_value_heads``
    key/value heads (``d_model``: the residual stream's width, kept for MIB's ``cfg``).

    Forward node ``i`` (:attr:`upstream`): 0 is ``input``; head ``h`` of layer ``l`` is
    ``1 + l * (heads + 1) + h``; the MLP of layer ``l`` is ``1 + l * (heads + 1) + heads``.
    Backward node ``j`` (:attr:`downstream`): per layer the ``heads`` query inputs, the ``key_value_heads``
    key inputs, the ``key_value_heads`` value inputs and the MLP; ``logits`` last.
    """

    layers: int
    heads: int
    key_value_heads: int
    d_model: int

    @property
    def per_layer(self) -> int:
        """Backward nodes per layer: the heads' inputs and the MLP."""
        return self.heads + 2 * self.key_value_heads + 1

    @cached_property
    def upstream(self) -> list[str]:
        """MIB names of the forward nodes, in index order."""
        names = ["input"]
        for layer in range(self.layers):
            names += [head_node(layer, head) for head in range(self.heads)] + [mlp_node(layer)]
        return names

    @cached_property
    def downstream(self) -> list[str]:
        """MIB names of the backward nodes, in index order."""
        names = []
        for layer in range(self.layers):
            for letter, count in zip(QKV, self.input_heads, strict=True):
                names += [f"{head_node(layer, head)}<{letter}>" for head in range(count)]
            names.append(mlp_node(layer))
        return [*names, "logits"]

    @property
    def input_heads(self) -> tuple[int, int, int]:
        """How many query, key and value inputs a layer has."""
        return self.heads, self.key_value_heads, self.key_value_heads

    def head_inputs(self, layer: int, letter: str) -> slice:
        """Backward indices of layer ``layer``'s query (``letter`` ``"q"``), key or value inputs."""
        start = layer * self.per_layer + sum(self.input_heads[: QKV.index(letter)])
        return slice(start, start + self.input_heads[QKV.index(letter)])

    def mlp_input(self, layer: int) -> int:
        """Backward index of the MLP of ``layer``."""
        return layer * self.per_layer + self.per_layer - 1

    @property
    def logits(self) -> int:
        """Backward index of ``logits``."""
        return self.layers * self.per_layer

    def head_output(self, layer: int, head: int) -> int:
        """Forward index of head ``head`` of ``layer``."""
        return 1 + layer * (self.heads + 1) + head

    def mlp_output(self, layer: int) -> int:
        """Forward index of the MLP of ``layer``."""
        return 1 + layer * (self.heads + 1) + self.heads

    @cached_property
    def feeds(self) -> np.ndarray:
        """[backward nodes] int: how many forward nodes (the first ones, by index) feed each backward node:
        ``1 + l * (heads + 1)`` for a head input of layer ``l``, ``heads`` more for its MLP, every forward
        node for ``logits``."""
        counts = np.empty(len(self.downstream), dtype=np.int64)
        for layer in range(self.layers):
            first = layer * self.per_layer
            counts[first : first + self.per_layer - 1] = 1 + layer * (self.heads + 1)
            counts[self.mlp_input(layer)] = self.mlp_output(layer)
        counts[self.logits] = len(self.upstream)
        return counts

    @cached_property
    def real(self) -> np.ndarray:
        """[forward nodes, backward nodes] bool: which pairs are edges (MIB's ``real_edge_mask``)."""
        return np.arange(len(self.upstream))[:, None] < self.feeds[None, :]

    @cached_property
    def forward_to_backward(self) -> np.ndarray:
        """[forward nodes, backward nodes] bool: which backward nodes are a forward node's own inputs (MIB's
        ``forward_to_backward``): a head's query input and its key/value head's key and value inputs, an
        MLP's input; ``input`` has none."""
        owns = np.zeros((len(self.upstream), len(self.downstream)), dtype=bool)
        groups = self.heads // self.key_value_heads
        for layer in range(self.layers):
            for head in range(self.heads):
                node = self.head_output(layer, head)
                owns[node, self.head_inputs(layer, "q").start + head] = True
                for letter in "kv":
                    owns[node, self.head_inputs(layer, letter).start + head // groups] = True
            owns[self.mlp_output(layer), self.mlp_input(layer)] = True
        return owns

    def pruned(self, kept: np.ndarray) -> np.ndarray:
        """[forward nodes, backward nodes] bool: the edges of ``kept`` (same shape) that lie on a path of
        kept edges from ``input`` to ``logits``, what MIB's ``Graph.prune`` leaves ("repeatedly removes
        nodes that lack incoming or outgoing edges (or both), and then edges missing a parent or child";
        ``evaluate_graph`` prunes every circuit before it runs it). Found here in one pass each way
        instead of MIB's repetition to a fixed point: the forward nodes reached from ``input``, then the
        backward nodes from which ``logits`` is reached."""
        kept = kept & self.real
        owns = self.forward_to_backward
        reached = np.zeros(len(self.upstream), dtype=bool)
        reached[0] = True
        for node in range(1, len(self.upstream)):
            inputs = owns[node]
            reached[node] = bool((kept[:node, inputs] & reached[:node, None]).any())
        reaching = np.zeros(len(self.downstream), dtype=bool)  # backward nodes from which logits is reached
        reaching[self.logits] = True
        for node in range(len(self.upstream) - 1, 0, -1):
            if (kept[node] & reaching).any():
                reaching |= owns[node]
        return kept & reached[:, None] & reaching[None, :]

    @property
    def edge_count(self) -> int:
        """The number of edges."""
        return int(self.real.sum())

    def edge_names(self, upstream: np.ndarray, downstream: np.ndarray) -> list[tuple[str, str]]:
        """(upstream, downstream) MIB names of the edges at forward indices ``upstream`` and backward indices
        ``downstream``."""
        return [(self.upstream[u], self.downstream[d]) for u, d in zip(upstream, downstream, strict=True)]

    def to_mib_json(self, scores: np.ndarray, in_graph: np.ndarray) -> dict[str, Any]:
        """The graph in MIB's circuit format, as ``eap.graph.Graph.to_json`` writes it: ``cfg`` (the model's
        sizes), ``nodes`` ``{name: {"in_graph": bool}}`` (a node is in the graph when an edge of the
        circuit touches it; ``logits`` always) and ``edges`` ``{"up->down": {"score", "in_graph"}}``.
        ``scores`` and ``in_graph``: [forward nodes, backward nodes], read at the real edges."""
        edges = {}
        touched = {"logits"}
        for u, d in zip(*np.nonzero(self.real), strict=True):
            up, down = self.upstream[u], self.downstream[d]
            kept = bool(in_graph[u, d])
            edges[f"{up}->{down}"] = {"score": float(scores[u, d]), "in_graph": kept}
            if kept:
                touched |= {up, down.split("<")[0]}
        nodes = {name: {"in_graph": name in touched} for name in [*self.upstream, "logits"]}
        cfg = {
            "n_layers": self.layers,
            "n_heads": self.heads,
            "n_key_value_heads": self.key_value_heads,
            "d_model": self.d_model,
            "parallel_attn_mlp": False,
        }
        return {"cfg": cfg, "nodes": nodes, "edges": edges}
