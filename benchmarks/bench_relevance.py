"""Benchmark: attention flow (ours) against the published one-max-flow-per-pair approach.

Abnar and Zuidema's code (github.com/samiraabnar/attention_flow, ``compute_flows``) builds one networkx
DiGraph of all ``(layers + 1) x n`` nodes from the residual-augmented attention and, for every non-input
node and every input node, runs ``nx.maximum_flow_value(G, u, v, flow_func=edmonds_karp)``: ``layers x
n^2`` pure-Python max-flows on the whole graph. Ours (``bertology.analysis.relevance.attention_flow``)
solves the same pairs with SciPy's compiled Dinic on per-layer graphs cut to what can carry flow, and the
first two layers in closed form.

Both run on the same input (the default model, all-MiniLM-L6-v2, on an English paragraph cut to ``n``
tokens), in the same process, with ``torch.set_num_threads(1)``. Times are CPU seconds of this process
(``time.process_time``; both are single-threaded), which a busy shared machine inflates less than wall
time. The baseline takes minutes per layer
at 32 tokens and hours at 64, so it is timed on a seeded random sample of ``--pairs-per-layer``
(token, input token) pairs in each layer (``numpy.random.default_rng(0)``), and its total is
extrapolated as ``graph build + sum over layers of n^2 x (mean seconds per sampled pair of that layer)``;
the sampled values are checked against ours (difference at most ``flow_error_bound`` plus float noise).

Run: ``.venv/bin/python benchmarks/bench_relevance.py [--lengths 32 64] [--pairs-per-layer 16]``
"""

from __future__ import annotations

import argparse
import platform
import time

import networkx as nx
import numpy as np
import torch

import bertology
from bertology.analysis.relevance import attention_flow, flow_error_bound, residual_attention

PARAGRAPH = (
    "The committee met on a cold morning in early March to decide whether the old railway bridge "
    "should be repaired or replaced. Engineers had warned for years that the steel was rusting, but "
    "the town could not agree on who would pay. Some residents wanted a new bridge with a wider "
    "footpath and a lane for bicycles, while others argued that the historic structure was part of "
    "the town's identity and deserved to be saved. After three hours of debate, the chair proposed a "
    "compromise: the bridge would be restored, and a separate footbridge would be built beside it."
)


def attention_of_length(loaded: bertology.LoadedModel, n: int) -> np.ndarray:
    """probs [layers, heads, n, n] of ``PARAGRAPH`` (repeated as needed) cut to ``n`` tokens, special tokens
    included."""
    text = " ".join([PARAGRAPH] * (1 + n // 100))
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"][: n - 2]
    attention = bertology.capture(loaded.tokenizer.decode(ids), model=loaded)
    assert len(attention.tokens) == n, len(attention.tokens)
    return attention.probs


def published_graph(probs: np.ndarray) -> nx.DiGraph:
    """The published construction: an adjacency matrix over ``(layers + 1) x n`` nodes, node
    ``l * n + i`` = token ``i`` at layer ``l`` (0 = input), edge ``(l, i) -> (l - 1, k)`` with capacity
    ``Â_{l-1}[i, k]``, turned into a networkx DiGraph."""
    augmented = residual_attention(probs)
    layers, n, _ = augmented.shape
    adjacency = np.zeros(((layers + 1) * n, (layers + 1) * n))
    for layer in range(1, layers + 1):
        adjacency[layer * n : (layer + 1) * n, (layer - 1) * n : layer * n] = augmented[layer - 1]
    return nx.from_numpy_array(adjacency, create_using=nx.DiGraph, edge_attr="capacity")


def published_pair(graph: nx.DiGraph, n: int, layer: int, token: int, input_token: int) -> float:
    """One pair the published way: Edmonds-Karp from node (layer + 1, token) to input node."""
    source = (layer + 1) * n + token
    return nx.maximum_flow_value(graph, source, input_token, flow_func=nx.algorithms.flow.edmonds_karp)


def benchmark(loaded: bertology.LoadedModel, n: int, pairs_per_layer: int) -> str:
    probs = attention_of_length(loaded, n)
    layers = probs.shape[0]
    start = time.process_time()
    ours = attention_flow(probs, max_tokens=n)
    ours_s = time.process_time() - start

    start = time.process_time()
    graph = published_graph(probs)
    baseline_s = time.process_time() - start
    rng = np.random.default_rng(0)
    worst = 0.0
    sampled = min(pairs_per_layer, n * n)
    for layer in range(layers):
        chosen = rng.choice(n * n, size=sampled, replace=False)
        start = time.process_time()
        values = [published_pair(graph, n, layer, *divmod(int(pair), n)) for pair in chosen]
        baseline_s += (time.process_time() - start) / sampled * n * n
        ours_values = ours[layer].reshape(-1)[chosen]
        worst = max(worst, float(np.abs(np.array(values) - ours_values).max()))
    bound = flow_error_bound(layers, n)
    assert worst <= bound + 1e-9, f"values differ by {worst:.3g} (bound {bound:.3g})"
    return (
        f"| {n} | {layers} | {layers * n * n:,} | {ours_s:.1f} s | {baseline_s:,.0f} s "
        f"(sample of {sampled} pairs x {layers} layers) | {baseline_s / ours_s:,.0f}x | {worst:.1e} "
        f"(bound {bound:.1e}) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[32, 64])
    parser.add_argument("--pairs-per-layer", type=int, default=16, help="baseline pairs timed per layer")
    parser.add_argument(
        "--ours-only", type=int, nargs="*", default=[], help="also time only our flow at these lengths"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = bertology.load_model()
    print(f"machine: {platform.machine()}, 1 torch thread, python {platform.python_version()}")
    print(
        "| tokens | layers | max-flows | ours (CPU) | published approach (networkx, extrapolated, CPU) "
        "| speed-up | largest difference on the sample |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.lengths:
        print(benchmark(loaded, n, args.pairs_per_layer), flush=True)
    for n in args.ours_only:
        probs = attention_of_length(loaded, n)
        start = time.process_time()
        attention_flow(probs, max_tokens=n)
        seconds = time.process_time() - start
        print(f"| {n} | {probs.shape[0]} | ours only: {seconds:.1f} s (CPU) |", flush=True)


if __name__ == "__main__":
    main()
