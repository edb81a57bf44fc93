"""Edge scores: the change of the metric when one edge of the graph carries the source run's value instead
of the target run's (MIB's ``eap/attribute.py``).

With the default direction (``noising``: the target run is the clean input, the source the corrupted one)
these are MIB's definitions:

- ``exact`` (``get_scores_exact``): ``m(every edge but u->v) - m(clean)``, each edge removed alone by its own
  masked pass (:func:`~bertology.interventions.circuit_pass.masked_pass`).
- ``eap`` (Syed et al. 2023, ``get_scores_eap``): the first-order estimate
  ``(z_u(corrupted) - z_u(clean)) · dm/d(input_v)``, the activation difference of the upstream node's output
  from two plain runs and the gradient of the metric at the downstream node's input in the clean run,
  summed over positions.
- ``eap-ig`` (Hanna et al. 2024, ``get_scores_eap_ig``, MIB's "EAP-IG-inputs"): the same difference times
  the gradient averaged over ``steps`` runs whose ``input`` node (the embeddings entering layer 0) is
  ``e_corrupted + (k / steps) (e_clean - e_corrupted)``, ``k = 0 .. steps - 1`` (MIB's points: the
  corrupted end included, the clean end not).

Every score is the mean over the pairs (MIB divides the sum over its batches by the number of examples).
In a post-norm encoder both outputs are the upstream node's contributions carried to the downstream node's
input point, each with its own run's LayerNorm scales (:mod:`~bertology.interventions.circuit_norms`).
``denoising`` swaps the runs (target corrupted, source clean).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bertology.interventions.circuit_graph import CircuitGraph
from bertology.interventions.circuit_norms import (
    NormRecord,
    SourceStacks,
    Stages,
    circuit_stages,
    stage_differences,
)
from bertology.interventions.circuit_pass import (
    GradientPoint,
    circuit_graph,
    gradient_pass,
    masked_pass,
    node_outputs,
)
from bertology.interventions.patching_metrics import Scorer, patching_metric
from bertology.interventions.patching_pairs import PairGroup
from bertology.models.loading import LoadedModel
from bertology.options import PatchDirection, PatchMetric


@dataclass
class CircuitRuns:
    """The plain runs of one group of pairs: ``outputs`` and ``logits`` per run (``"clean"``,
    ``"corrupted"``; outputs [forward nodes, rows, pos, d_model]), which run is the ``target`` (the one
    the model runs, its edges kept in a circuit) and which the ``source`` (what an absent edge carries), the
    metric bound to the group, ``norms`` each run's norms between the nodes and ``stages`` where the nodes
    read the stream (:mod:`~bertology.interventions.circuit_norms`) and, where asked for (EAP's),
    ``gradient``: [backward nodes, rows, pos, d_model] the gradient of the metric summed over the rows at
    each backward node's input in the target run."""

    group: PairGroup
    outputs: dict[str, torch.Tensor]
    logits: dict[str, torch.Tensor]
    target: str
    source: str
    score: Scorer
    norms: dict[str, NormRecord]
    stages: Stages
    gradient: torch.Tensor | None = None

    def run(self, name: str) -> tuple[torch.Tensor, NormRecord]:
        """Run ``name``'s node outputs and norms."""
        return self.outputs[name], self.norms[name]

    def source_stacks(self) -> SourceStacks:
        """What absent edges carry under counterfactual patching: the source run's contributions."""
        return SourceStacks(self.stages, *self.run(self.source))

    @property
    def target_inputs(self) -> dict[str, torch.Tensor]:
        """The model's inputs of the target run."""
        return getattr(self.group, self.target)  # type: ignore[no-any-return]

    def metric(self, run: str) -> torch.Tensor:
        """[pairs] the metric of plain run ``run``."""
        return self.score(self.logits[run])


def metric_gradient(
    score: Scorer, logits: torch.Tensor, inputs: dict[int, GradientPoint], total: torch.Tensor | None = None
) -> torch.Tensor:
    """[backward nodes, rows, pos, d_model] float the gradient of ``score(logits)`` summed over the rows at
    the backward nodes' inputs (``inputs``: where each is taken, by first backward index, as
    :func:`~bertology.interventions.circuit_pass.gradient_pass` gives them), added in place to ``total``
    where given (each node's part as it is found, without a concatenation)."""
    order = sorted(inputs)
    found = torch.autograd.grad(score(logits).sum(), [inputs[index].tensor for index in order])
    fresh = total is None
    if total is None:
        rows, pos, _, width = inputs[order[-1]].tensor.shape
        total = torch.empty(sum(part.shape[2] for part in found), rows, pos, width, device=logits.device)
    with torch.no_grad():
        for index, part in zip(order, found, strict=True):
            gradient = inputs[index].input_gradient(part).permute(2, 0, 1, 3)
            place = total[index : index + gradient.shape[0]]
            if fresh:
                place.copy_(gradient)
            else:
                place.add_(gradient)
    return total


def circuit_runs(
    loaded: LoadedModel,
    group: PairGroup,
    direction: PatchDirection,
    metric: PatchMetric,
    gradient: bool = False,
) -> CircuitRuns:
    """The clean and the corrupted run of ``group`` (``direction``: ``noising`` runs the clean input with
    corrupted edges, MIB's setting; ``denoising`` the reverse); with ``gradient`` the target run is a
    pass with gradients, and the metric's gradient at its backward nodes' inputs is kept (what EAP
    needs, without a run of its own)."""
    source, target = ("clean", "corrupted") if direction == "denoising" else ("corrupted", "clean")
    outputs, logits, norms = {}, {}, {}
    outputs[source], logits[source], norms[source] = node_outputs(loaded, getattr(group, source))
    inputs: dict[int, GradientPoint] = {}
    if gradient:
        logits[target], inputs, recorded = gradient_pass(loaded, getattr(group, target), record=True)
        assert recorded is not None
        outputs[target], norms[target] = recorded
    else:
        outputs[target], logits[target], norms[target] = node_outputs(loaded, getattr(group, target))
    score = Scorer(patching_metric(metric), group)
    score.know_clean(logits["clean"])
    found = metric_gradient(score, logits[target], inputs) if gradient else None
    logits[target] = logits[target].detach()
    stages = circuit_stages(loaded, circuit_graph(loaded))
    return CircuitRuns(group, outputs, logits, target, source, score, norms, stages, found)


def edge_products(
    graph: CircuitGraph, difference: torch.Tensor, gradient: torch.Tensor, reads: slice | None = None
) -> torch.Tensor:
    """[forward nodes, backward nodes] each edge's ``difference[u] · gradient[v]`` (``difference``: [forward
    nodes, n], ``gradient``: [backward nodes, n]) into the backward nodes ``reads`` (default: every one),
    one matrix product per layer over the forward nodes that feed it; 0 elsewhere and where there is no
    edge."""
    reads = slice(0, len(graph.downstream)) if reads is None else reads
    scores = torch.zeros(len(graph.upstream), len(graph.downstream), device=difference.device)
    for layer in range(graph.layers + 1):
        start = max(layer * graph.per_layer, reads.start)
        stop = min((layer + 1) * graph.per_layer, len(graph.downstream), reads.stop)
        if start < stop:
            feeds = int(graph.feeds[stop - 1])
            scores[:feeds, start:stop] = difference[:feeds] @ gradient[start:stop].T
    return scores * torch.as_tensor(graph.real, device=scores.device)


def attribution_scores(loaded: LoadedModel, runs: CircuitRuns, steps: int | None = None) -> torch.Tensor:
    """[forward nodes, backward nodes] the sum over ``runs``' pairs of the EAP score (``steps`` ``None``:
    ``runs`` made with ``gradient``) or the EAP-IG score with ``steps`` points (module docstring); 0 where
    there is no edge."""
    source, target = runs.outputs[runs.source], runs.outputs[runs.target]
    if steps is None:
        assert runs.gradient is not None, "EAP reads the gradient of circuit_runs(..., gradient=True)"
        gradient = runs.gradient
    else:
        found: torch.Tensor | None = None
        for k in range(steps):
            embedding = source[0] + (k / steps) * (target[0] - source[0])
            logits, inputs, _ = gradient_pass(loaded, runs.target_inputs, embedding)
            found = metric_gradient(runs.score, logits, inputs, found)
        assert found is not None
        gradient = found.div_(steps)
    graph = circuit_graph(loaded)
    scores = torch.zeros(len(graph.upstream), len(graph.downstream), device=gradient.device)
    for reads, difference in stage_differences(runs.run(runs.source), runs.run(runs.target), runs.stages):
        scores += edge_products(graph, difference.flatten(1), gradient.flatten(1), reads)
    return scores


def exact_scores(
    loaded: LoadedModel, runs: CircuitRuns, on_edge_done: Callable[[], None] | None = None
) -> torch.Tensor:
    """[forward nodes, backward nodes] the sum over ``runs``' pairs of ``m(target with edge u->v from the
    source) - m(target)``, one masked pass per edge; 0 where there is no edge. ``on_edge_done``: called
    with no argument after each edge."""
    graph: CircuitGraph = circuit_graph(loaded)
    device = runs.outputs[runs.target].device
    scores = torch.zeros(len(graph.upstream), len(graph.downstream), device=device)
    baseline = runs.metric(runs.target).sum()
    absent = torch.zeros_like(scores)
    for upstream, downstream in zip(*graph.real.nonzero(), strict=True):
        absent[upstream, downstream] = 1
        logits = masked_pass(loaded, runs.target_inputs, runs.source_stacks(), absent)
        scores[upstream, downstream] = runs.score(logits).sum() - baseline
        absent[upstream, downstream] = 0
        if on_edge_done is not None:
            on_edge_done()
    return scores
