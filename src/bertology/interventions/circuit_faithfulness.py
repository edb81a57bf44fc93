"""Faithfulness of circuits, measured by masked forward passes, and the areas MIB scores a method by
(``MIB_circuit_track/evaluation.py``, ``evaluate_area_under_curve``).

A circuit of ``n`` edges is the ``n`` edges of largest absolute score (``apply_topn(n, absolute=True)``, MIB's
``--absolute``; ties in the edges' order). Every edge outside it carries the source run's value
(counterfactual patching, MIB's ``intervention='patching'``) or, with ``mean`` ablation, its upstream
node's output averaged over every position of the texts of every pair's source input
(:mod:`~bertology.interventions.pair_mean`, the same mean as ``bertology patch --ablation mean``; MIB's
``'mean'`` takes the mean over a separate intervention dataset, bertology over the pairs' source inputs).
Its faithfulness is

    f(C) = (m(C) - m(empty)) / (m(full) - m(empty)),

``m`` the metric averaged over the pairs, ``m(full)`` the plain target run's (MIB's ``evaluate_baseline``) and
``m(empty)`` the masked pass with no edge kept (MIB's ``apply_topn(0)``). Under counterfactual patching that
pass gives every node the source run's input, so ``m(empty)`` is the plain source run's metric, read from that
run (the masked pass reproduces it to rounding: tested).

Every circuit is pruned before it runs, as MIB's ``evaluate_graph`` prunes it (``graph.prune()``: only the
edges on a path of kept edges from ``input`` to ``logits`` stay,
:meth:`~bertology.interventions.circuit_graph.CircuitGraph.pruned`). A circuit pruned to nothing is the
empty circuit and one that keeps every edge the target run: their metrics are ``m(empty)`` and ``m(full)``,
without another pass. Pruning leaves the metric as it is under counterfactual patching in a pre-norm model (a
node no kept edge feeds computes the source run's output, which its kept out-edges carry as absent ones
would); it can change it under mean ablation (such a node computes its output on the means, not the mean of
its output) and in a post-norm encoder (its kept out-edges carry its output through the norms with the pass's
scales, absent ones with the source run's).

Sizes: MIB's fractions of the edges ``0.1 %, 0.2 %, 0.5 %, 1 %, 2 %, 5 %, 10 %, 20 %, 50 %, 100 %``, each
``int(fraction * edges)`` edges. Areas over the fractions (a linear axis, MIB's ``log_scale=False``), by the
trapezoid rule between consecutive sizes: CPR = the area under the curve (higher is better), CMD = the area
between the curve and 1, ``|1 - f|`` (lower is better). Where this differs from MIB: MIB's curve reports,
beside each size, the weighted count of the edges its pruning left; bertology reports the ``n`` edges asked
for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from bertology.interventions.circuit_graph import CircuitGraph
from bertology.interventions.circuit_norms import SourceStacks, mean_stacks
from bertology.interventions.circuit_pass import circuit_graph, masked_pass
from bertology.interventions.circuit_scores import CircuitRuns
from bertology.models.loading import LoadedModel

#: MIB's circuit sizes, as fractions of the graph's edges.
FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def edge_counts(edges: int, fractions: Sequence[float] = FRACTIONS) -> list[int]:
    """The number of edges of each circuit size, ``int(fraction * edges)`` as MIB counts them."""
    return [int(fraction * edges) for fraction in fractions]


def ranking(scores: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Flat indices of the real edges of ``scores`` [forward nodes, backward nodes], by absolute score from
    the largest (ties: the edges' order)."""
    edges = np.flatnonzero(real)
    return edges[np.argsort(-np.abs(scores.ravel()[edges]), kind="stable")]


def random_ranking(real: np.ndarray, seed: int) -> np.ndarray:
    """Flat indices of the real edges in a random order drawn with ``seed``."""
    return np.random.default_rng(seed).permutation(np.flatnonzero(real))


def top_edges(order: np.ndarray, count: int, shape: tuple[int, int]) -> np.ndarray:
    """[forward nodes, backward nodes] bool: the first ``count`` edges of ``order``."""
    kept = np.zeros(shape[0] * shape[1], dtype=bool)
    kept[order[:count]] = True
    return kept.reshape(shape)


def replacements(runs: Sequence[CircuitRuns], ablation: str) -> list[SourceStacks]:
    """Per group, what an absent edge carries: the source run's outputs (``counterfactual``) or, ``mean``,
    [forward nodes, 1, 1, d_model] every group's source outputs averaged over rows and the texts' positions
    (:func:`~bertology.interventions.pair_mean.mean_over_texts`; in a post-norm encoder: contributions,
    carried to each stage, then averaged)."""
    if ablation == "counterfactual":
        return [run.source_stacks() for run in runs]
    sources = [run.run(run.source) for run in runs]
    mean = mean_stacks(sources, [run.group.prompt_tokens for run in runs], runs[0].stages)
    return [mean for _ in runs]


def circuit_metric(
    loaded: LoadedModel, runs: Sequence[CircuitRuns], carried: Sequence[SourceStacks], kept: np.ndarray
) -> float:
    """The metric averaged over every pair of ``runs`` by one masked pass per group with only the edges
    ``kept`` (bool [forward nodes, backward nodes], as they are: not pruned) from the target run, the others
    carrying ``carried`` (one per group)."""
    total, pairs = 0.0, 0
    for run, replacement in zip(runs, carried, strict=True):
        absent = torch.as_tensor(~kept, device=run.outputs[run.target].device).float()
        logits = masked_pass(loaded, run.target_inputs, replacement, absent)
        values = run.score(logits)
        total += float(values.sum())
        pairs += len(values)
    return total / pairs


def empty_metric(
    loaded: LoadedModel, runs: Sequence[CircuitRuns], carried: Sequence[SourceStacks], ablation: str
) -> float:
    """``m(empty)``: the source run's metric averaged over the pairs under counterfactual patching (module
    docstring), else the masked pass with no edge kept."""
    if ablation == "counterfactual":
        values = [run.metric(run.source) for run in runs]
        return sum(float(value.sum()) for value in values) / sum(len(value) for value in values)
    return circuit_metric(loaded, runs, carried, np.zeros_like(circuit_graph(loaded).real))


def faithfulness(value: float, full: float, empty: float) -> float:
    """``(value - empty) / (full - empty)``."""
    return (value - empty) / (full - empty)


def curve(
    loaded: LoadedModel,
    runs: Sequence[CircuitRuns],
    carried: Sequence[SourceStacks],
    order: np.ndarray,
    graph: CircuitGraph,
    full: float,
    empty: float,
    on_size_done: Callable[[], None] | None = None,
) -> list[float]:
    """The faithfulness of the circuit of each of MIB's sizes taken from ``order`` (flat edge indices of
    ``graph``'s edges), each pruned before it runs (module docstring)."""
    values = []
    for count in edge_counts(graph.edge_count):
        kept = graph.pruned(top_edges(order, count, graph.real.shape))
        if not kept.any():
            value = empty
        elif kept.sum() == graph.edge_count:
            value = full
        else:
            value = circuit_metric(loaded, runs, carried, kept)
        values.append(faithfulness(value, full, empty))
        if on_size_done is not None:
            on_size_done()
    return values


def areas(values: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> tuple[float, float]:
    """(CPR, CMD) of a curve ``values`` at ``fractions`` (module docstring)."""
    under = from_one = 0.0
    for i in range(len(values) - 1):
        (x1, f1), (x2, f2) = (fractions[i], values[i]), (fractions[i + 1], values[i + 1])
        under += (x2 - x1) * (f1 + f2) / 2
        from_one += (x2 - x1) * (abs(1 - f1) + abs(1 - f2)) / 2
    return under, from_one
