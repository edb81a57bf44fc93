"""Edge scores: the change of the metric when one edge of the graph carries the source run's value instead
of the target run's (MIB's ``eap/attribute.py``).

With the default direction (``noising``: the target run is the clean input, the source the corrupted one)
these are MIB's definitions:

- ``exact`` (``get_scores_exact``): ``m(every edge but u->v) - m(clean)``, each edge removed alone by its own
  masked pass (:func:`~bertology.interventions.circuit_pass.masked_pass`).
- ``eap`` (Syed et al. 2023, ``get_scores_eap``): the first-order estimate
  ``(z_u(corrupted) - z_u(clean)) · dm/d(input_v)``, the activation difference of the upstream node's output
  from the two runs and the gradient of the metric at the downstream node's input in the clean run,
  summed over positions.
- ``eap-ig`` (Hanna et al. 2024, ``get_scores_eap_ig``, MIB's "EAP-IG-inputs"): the same difference times
  the gradient averaged over ``steps`` runs whose ``input`` node (the embeddings entering layer 0) is
  ``e_corrupted + (k / steps) (e_clean - e_corrupted)``, ``k = 0 .. steps - 1`` (MIB's points: the
  corrupted end included, the clean end not; the point ``k = 0`` is the corrupted run itself where the
  inputs differ in their tokens only, :func:`circuit_runs`).

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
    token_slice,
)
from bertology.interventions.circuit_pass import (
    GradientPoint,
    circuit_graph,
    gradient_pass,
    masked_pass,
    node_outputs,
)
from bertology.interventions.partial import tiled
from bertology.interventions.patching_metrics import Scorer, patching_metric
from bertology.interventions.patching_pairs import PairGroup
from bertology.models.loading import LoadedModel
from bertology.models.sites import HeadInputGradientSum, head_input_gradients
from bertology.options import CircuitMethod, PatchDirection, PatchMetric


@dataclass
class CircuitRuns:
    """The plain runs of one group of pairs: ``outputs`` and ``logits`` per run (``"clean"``,
    ``"corrupted"``; outputs [forward nodes, rows, pos, d_model]), which run is the ``target`` (the one
    the model runs, its edges kept in a circuit) and which the ``source`` (what an absent edge carries), the
    metric bound to the group, ``norms`` each run's norms between the nodes and ``stages`` where the nodes
    read the stream (:mod:`~bertology.interventions.circuit_norms`) and, where asked for (EAP, EAP-IG),
    ``gradient``: the gradient of the metric summed over the rows at each backward node's input
    (:class:`InputGradients`): in the target run (EAP's) or averaged over EAP-IG's points."""

    group: PairGroup
    outputs: dict[str, torch.Tensor]
    logits: dict[str, torch.Tensor]
    target: str
    source: str
    score: Scorer
    norms: dict[str, NormRecord]
    stages: Stages
    gradient: InputGradients | None = None

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


class InputGradients:
    """The gradient of a metric summed over a group's rows at every backward node's input, averaged over
    passes with gradients (EAP: the target run; EAP-IG: its points): :meth:`add` one pass, :meth:`write`
    the mean at some of the rows' positions, [backward nodes, tokens, d_model] float (never all at once:
    :func:`attribution_scores` multiplies a few positions at a time)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.new_head_sum = head_input_gradients(loaded.model)
        self.heads: dict[int, HeadInputGradientSum] = {}  # by first backward index: a layer's q, k, v inputs
        self.direct: dict[int, torch.Tensor] = {}  # the others' sums [rows, pos, nodes, d_model]
        self.passes = 0

    def add(
        self, score: Scorer, logits: torch.Tensor, points: dict[int, GradientPoint], copies: int = 1
    ) -> None:
        """The gradient of ``score(logits)`` summed over the rows at the backward nodes' inputs of one pass
        (``points``: where each is taken, as :func:`~bertology.interventions.circuit_pass.gradient_pass`
        gives them) of ``copies`` passes side by side (copy ``k``: rows ``k * rows .. (k + 1) * rows - 1``),
        each counted as one."""
        order = sorted(points)
        found = torch.autograd.grad(score(logits, copies).sum(), [points[index].tensor for index in order])
        self.passes += copies
        with torch.no_grad():
            for index, part in zip(order, found, strict=True):
                point = points[index]
                if point.site is None:
                    part = part.unflatten(0, (copies, -1)).sum(0)
                    self.direct[index] = self.direct[index].add_(part) if index in self.direct else part
                    continue
                if index not in self.heads:
                    self.heads[index] = self.new_head_sum(*point.site)
                assert point.layer_input is not None
                self.heads[index].add(point.layer_input, point.tensor, part, copies)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(backward nodes, tokens: the rows' positions, d_model)."""
        last = max(self.direct)
        rows, pos, nodes, width = self.direct[last].shape
        return last + nodes, rows * pos, width

    def write(self, out: torch.Tensor, tokens: slice) -> None:
        """Write the mean over the passes at ``tokens`` (of the rows' positions taken row after row) into
        ``out`` [backward nodes, tokens, d_model] float, node by node."""
        with torch.no_grad():
            for index, heads in self.heads.items():
                heads.write(out[index : index + heads.weight.shape[0]], tokens)
            for index, part in self.direct.items():
                here = part.flatten(0, 1)[tokens].transpose(0, 1)
                torch.div(here, self.passes, out=out[index : index + here.shape[0]])


def _tokens_only(group: PairGroup) -> bool:
    """Whether ``group``'s clean and corrupted inputs differ in their tokens only (``input_ids`` of one
    shape; the attention mask and every other input the same), so that a run on the one differs from a run
    on the other in what the ``input`` node (the embeddings entering layer 0) carries only."""
    clean, corrupted = group.clean, group.corrupted

    def same(key: str) -> bool:
        one, other = clean[key], corrupted[key]
        if key == "input_ids":
            return bool(one.shape == other.shape)
        if isinstance(one, torch.Tensor) and isinstance(other, torch.Tensor):
            return one.shape == other.shape and torch.equal(one, other)
        return bool(one == other)

    return clean.keys() == corrupted.keys() and all(same(key) for key in clean)


def circuit_runs(
    loaded: LoadedModel,
    group: PairGroup,
    direction: PatchDirection,
    metric: PatchMetric,
    method: CircuitMethod | None = None,
    ig_steps: int = 5,
) -> CircuitRuns:
    """The clean and the corrupted run of ``group`` (``direction``: ``noising`` runs the clean input with
    corrupted edges, MIB's setting; ``denoising`` the reverse) and, for ``method`` ``eap`` or ``eap-ig``,
    the metric's gradient at the backward nodes' inputs that :func:`attribution_scores` multiplies (module
    docstring): EAP's from the target run made a pass with gradients; EAP-IG's summed over its
    ``ig_steps`` points and divided by their number, up to :data:`_TOKENS_PER_GRADIENT_PASS` tokens of
    points side by side in one pass. (``exact`` or ``None``: the plain runs only.)

    EAP-IG's first point (``k = 0``) gives the ``input`` node the source run's embeddings: where the
    group's clean and corrupted inputs differ in their tokens only (the same attention mask and every other
    input; the model reads its tokens through its embeddings only, what the ``input`` node carries), that
    pass is the source run itself, and the source run's node outputs and norms are recorded there rather
    than in a plain run of their own. Elsewhere the source run is a plain run and every point a pass on
    the target input."""
    source, target = ("clean", "corrupted") if direction == "denoising" else ("corrupted", "clean")
    inputs = {name: getattr(group, name) for name in (source, target)}
    outputs, logits, norms = {}, {}, {}

    def plain(run: str) -> None:
        outputs[run], logits[run], norms[run] = node_outputs(loaded, inputs[run])

    def with_gradients(run: str) -> dict[int, GradientPoint]:
        logits[run], points, recorded = gradient_pass(loaded, inputs[run], record=True)
        assert recorded is not None
        outputs[run], norms[run] = recorded
        return points

    taken: tuple[str, dict[int, GradientPoint]] | None = None  # the run with gradients, where they are taken
    if method == "eap":
        plain(source)
        taken = target, with_gradients(target)
    elif method == "eap-ig" and _tokens_only(group):
        plain(target)
        taken = source, with_gradients(source)  # EAP-IG's first point
    else:
        plain(source)
        plain(target)
    score = Scorer(patching_metric(metric), group)
    score.know_clean(logits["clean"])
    gradients = InputGradients(loaded)
    if taken is not None:
        gradients.add(score, logits[taken[0]], taken[1])
    if method == "eap-ig":
        start, end = outputs[source][0], outputs[target][0]  # [rows, pos, d_model]
        rows = start.shape[0]
        together = max(1, _TOKENS_PER_GRADIENT_PASS // (rows * start.shape[1]))
        for first in range(gradients.passes, ig_steps, together):
            points = range(first, min(first + together, ig_steps))
            embedding = torch.cat([start + (k / ig_steps) * (end - start) for k in points])
            step = gradient_pass(loaded, tiled(inputs[target], len(points), rows), embedding)
            gradients.add(score, *step[:2], copies=len(points))
    logits = {name: value.detach() for name, value in logits.items()}
    stages = circuit_stages(loaded, circuit_graph(loaded))
    return CircuitRuns(
        group, outputs, logits, target, source, score, norms, stages, gradients if gradients.passes else None
    )


#: EAP-IG's points run side by side in one pass with gradients up to this many tokens
#: (``benchmarks/bench_circuit_passes.py``, smollm2-135m on the 18 IOI pairs, 252 tokens a point: EAP-IG's
#: second and third scoring in a process 12.1 and 11.8 plain passes with 2 points a pass, peak 2.8 GiB; 12.5
#: and 12.1 with 4, 3.4 GiB; 13.0 and 13.0 with 1, 2.3 GiB).
_TOKENS_PER_GRADIENT_PASS = 512
#: Backward nodes of this many layers are multiplied in one matrix product (over the forward nodes that
#: feed the last of them; the products of forward nodes that feed none are no edge and dropped).
_LAYERS_PER_PRODUCT = 3
#: Positions whose activation differences and gradients are multiplied at once (both stay in the cache).
_TOKENS_PER_PRODUCT = 8
#: Positions whose gradient is written at once (each projection's weight read once for them).
_TOKENS_PER_GRADIENT = 64


def _add_edge_products(
    graph: CircuitGraph, difference: torch.Tensor, gradient: torch.Tensor, reads: slice, scores: torch.Tensor
) -> None:
    """Add each edge's ``difference[u] · gradient[v]`` (``difference``: [forward nodes, n], ``gradient``:
    [backward nodes, n]) into ``scores`` [forward nodes, backward nodes], for the backward nodes
    ``reads``: one matrix product per :data:`_LAYERS_PER_PRODUCT` layers over the forward nodes that feed
    them (pairs that are no edge get a product too)."""
    width = _LAYERS_PER_PRODUCT * graph.per_layer
    for first in range(reads.start - reads.start % width, reads.stop, width):
        start, stop = max(first, reads.start), min(first + width, reads.stop)
        feeds = int(graph.feeds[stop - 1])
        scores[:feeds, start:stop].addmm_(difference[:feeds], gradient[start:stop].T)


def attribution_scores(loaded: LoadedModel, runs: CircuitRuns) -> torch.Tensor:
    """[forward nodes, backward nodes] the sum over ``runs``' pairs of the EAP or EAP-IG score (module
    docstring), from the gradient of ``runs`` (:func:`circuit_runs` with the method); 0 where there is no
    edge. The gradient is written :data:`_TOKENS_PER_GRADIENT` positions at a time and multiplied with the
    activation difference :data:`_TOKENS_PER_PRODUCT` positions at a time (both then in the cache; neither
    is ever whole in memory, whose first writes cost as much as the products)."""
    assert runs.gradient is not None, "EAP and EAP-IG read the gradient of circuit_runs(..., method)"
    graph = circuit_graph(loaded)
    nodes, tokens, width = runs.gradient.shape
    device = runs.outputs[runs.target].device
    scores = torch.zeros(len(graph.upstream), len(graph.downstream), device=device)
    written = torch.empty(nodes * min(_TOKENS_PER_GRADIENT, tokens) * width, device=device)
    for begin in range(0, tokens, _TOKENS_PER_GRADIENT):
        count = min(_TOKENS_PER_GRADIENT, tokens - begin)
        gradient = written[: nodes * count * width].view(nodes, count, width)
        runs.gradient.write(gradient, slice(begin, begin + count))
        for first in range(0, count, _TOKENS_PER_PRODUCT):
            chunk = slice(begin + first, begin + min(first + _TOKENS_PER_PRODUCT, count))
            part = gradient[:, first : first + _TOKENS_PER_PRODUCT].flatten(1)
            source, target = (token_slice(runs.run(name), chunk) for name in (runs.source, runs.target))
            for reads, difference in stage_differences(source, target, runs.stages):
                _add_edge_products(graph, difference.flatten(1), part, reads, scores)
    return scores * torch.as_tensor(graph.real, device=device)


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
