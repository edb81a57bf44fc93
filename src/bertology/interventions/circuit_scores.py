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
from bertology.interventions.circuit_pass import circuit_graph, gradient_pass, masked_pass, node_outputs
from bertology.interventions.patching_metrics import Scorer, patching_metric
from bertology.interventions.patching_pairs import PairGroup
from bertology.models.loading import LoadedModel
from bertology.options import PatchDirection, PatchMetric


@dataclass
class CircuitRuns:
    """The plain runs of one group of pairs: ``outputs`` and ``logits`` per run (``"clean"``,
    ``"corrupted"``; outputs [rows, pos, forward nodes, d_model]), which run is the ``target`` (the one
    the model runs, its edges kept in a circuit) and which the ``source`` (what an absent edge carries), and
    the metric bound to the group; ``norms`` each run's norms between the nodes and ``stages`` where the
    nodes read the stream (:mod:`~bertology.interventions.circuit_norms`)."""

    group: PairGroup
    outputs: dict[str, torch.Tensor]
    logits: dict[str, torch.Tensor]
    target: str
    source: str
    score: Scorer
    norms: dict[str, NormRecord]
    stages: Stages

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


def circuit_runs(
    loaded: LoadedModel, group: PairGroup, direction: PatchDirection, metric: PatchMetric
) -> CircuitRuns:
    """The clean and the corrupted run of ``group`` (``direction``: ``noising`` runs the clean input with
    corrupted edges, MIB's setting; ``denoising`` the reverse)."""
    outputs, logits, norms = {}, {}, {}
    for run in ("clean", "corrupted"):
        outputs[run], logits[run], norms[run] = node_outputs(loaded, getattr(group, run))
    score = Scorer(patching_metric(metric), group)
    score.know_clean(logits["clean"])
    source, target = ("clean", "corrupted") if direction == "denoising" else ("corrupted", "clean")
    stages = circuit_stages(loaded, circuit_graph(loaded))
    return CircuitRuns(group, outputs, logits, target, source, score, norms, stages)


def attribution_scores(loaded: LoadedModel, runs: CircuitRuns, steps: int | None = None) -> torch.Tensor:
    """[forward nodes, backward nodes] the sum over ``runs``' pairs of the EAP score (``steps`` ``None``) or
    the EAP-IG score with ``steps`` points (module docstring); 0 where there is no edge."""
    graph = circuit_graph(loaded)
    source, target = runs.outputs[runs.source], runs.outputs[runs.target]
    points: list[float | None] = [None] if steps is None else [k / steps for k in range(steps)]
    gradient = torch.zeros(*target.shape[:2], len(graph.downstream), target.shape[-1], device=target.device)
    for alpha in points:
        embedding = None
        if alpha is not None:
            embedding = source[:, :, 0] + alpha * (target[:, :, 0] - source[:, :, 0])
        logits, inputs = gradient_pass(loaded, runs.target_inputs, embedding)
        order = sorted(inputs)
        found = torch.autograd.grad(runs.score(logits).sum(), [inputs[index] for index in order])
        gradient += torch.cat([part.float() for part in found], dim=2)
    gradient /= len(points)
    scores = torch.zeros(len(graph.upstream), len(graph.downstream), device=gradient.device)
    for reads, difference in stage_differences(runs.run(runs.source), runs.run(runs.target), runs.stages):
        scores[:, reads] = torch.einsum("bpud,bpvd->uv", difference, gradient[:, :, reads])
    return scores * torch.as_tensor(graph.real, device=scores.device)


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
