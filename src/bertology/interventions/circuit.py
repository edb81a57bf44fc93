"""Circuits by edge attribution patching, scored as the Mechanistic Interpretability Benchmark scores them
(MIB, Mueller et al. 2025; its circuit track github.com/hannamw/MIB-circuit-track on
github.com/hannamw/EAP-IG): :func:`circuit` scores every edge of a decoder's graph on clean/corrupted
pairs (the pairs files, metrics, directions and BOS option of ``bertology patch``), then measures the
faithfulness of the top edges at MIB's sizes against a seeded random ranking.

- the graph: :mod:`~bertology.interventions.circuit_graph` (MIB's nodes and edges, and where bertology's
  differs: the key/value inputs of grouped-query attention);
- the passes: :mod:`~bertology.interventions.circuit_pass` (node outputs, the masked pass of MIB's
  ``evaluate_graph``);
- the scores: :mod:`~bertology.interventions.circuit_scores` (EAP, EAP-IG, exact);
- faithfulness, CPR and CMD: :mod:`~bertology.interventions.circuit_faithfulness`.

The default direction is MIB's, ``noising``: the model runs on the clean input and an edge outside the
circuit carries the corrupted run's value. Decoder language models and post-norm encoder classifiers (BERT,
RoBERTa, XLM-RoBERTa, ELECTRA, CamemBERT, ERNIE, Data2Vec-Text, MPNet): a post-norm encoder's stream is no
sum of its nodes' outputs, so its nodes' contributions are carried through each LayerNorm
(:mod:`~bertology.interventions.circuit_norms`, bertology's *norm-carried contributions*); its graph ends
at the classifier's logits, which read the last layer's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from bertology.errors import BertologyError
from bertology.interventions.circuit_faithfulness import (
    FRACTIONS,
    areas,
    curve,
    edge_counts,
    empty_metric,
    random_ranking,
    ranking,
    replacements,
)
from bertology.interventions.circuit_graph import CircuitGraph
from bertology.interventions.circuit_norms import circuit_stages
from bertology.interventions.circuit_pass import circuit_graph
from bertology.interventions.circuit_scores import attribution_scores, circuit_runs, exact_scores
from bertology.interventions.data import eval_mode
from bertology.interventions.patching import load_pairs
from bertology.interventions.patching_metrics import patching_metric
from bertology.interventions.patching_pairs import PatchPair
from bertology.models.anatomy import shares_layers
from bertology.models.loading import LoadedModel, require_single_stack
from bertology.models.sites import require_site
from bertology.options import (
    CIRCUIT_ABLATIONS,
    CIRCUIT_METHODS,
    PATCH_DIRECTIONS,
    CircuitAblation,
    CircuitMethod,
    PatchDirection,
    PatchMetric,
)
from bertology.progress import Progress

#: The name of the seeded random ranking in the curves and areas.
RANDOM = "random"


@dataclass
class CircuitResult:
    """Edge scores and faithfulness curves of one model on one set of pairs.

    graph: the model's :class:`CircuitGraph`. scores: [forward nodes, backward nodes] each edge's score,
    the mean over the pairs (0 where there is no edge). fractions, edges: the circuit sizes (fractions of
    the edges, and counts). faithfulness: per ranking (the method, ``"random"``) f at each size.
    clean_metric, corrupted_metric: the metric's mean over the pairs in the plain clean and corrupted runs;
    full_metric, empty_metric: the target run's and the masked pass's with no edge kept (f's 1 and 0).
    """

    graph: CircuitGraph
    scores: np.ndarray
    method: CircuitMethod
    metric: PatchMetric
    direction: PatchDirection
    ablation: CircuitAblation
    ig_steps: int | None
    model: str
    pairs: int
    seed: int
    fractions: tuple[float, ...]
    edges: list[int]
    faithfulness: dict[str, list[float]]
    clean_metric: float
    corrupted_metric: float
    full_metric: float
    empty_metric: float

    def areas(self) -> dict[str, dict[str, float]]:
        """``{"cpr": {ranking: area}, "cmd": {ranking: area}}``."""
        found = {name: areas(values, self.fractions) for name, values in self.faithfulness.items()}
        return {
            "cpr": {name: value[0] for name, value in found.items()},
            "cmd": {name: value[1] for name, value in found.items()},
        }

    def edges_frame(self) -> pd.DataFrame:
        """One row per edge, ``upstream``, ``downstream`` (MIB names), ``score``, by absolute score from the
        largest."""
        order = ranking(self.scores, self.graph.real)
        upstream, downstream = np.unravel_index(order, self.scores.shape)
        names = self.graph.edge_names(upstream, downstream)
        return pd.DataFrame(
            {
                "upstream": [up for up, _ in names],
                "downstream": [down for _, down in names],
                "score": self.scores.ravel()[order],
            }
        )

    def faithfulness_frame(self) -> pd.DataFrame:
        """``method``, ``percent_edges``, ``edges``, ``faithfulness``: one row per ranking and size."""
        rows = [
            {"method": name, "percent_edges": 100 * fraction, "edges": count, "faithfulness": value}
            for name, values in self.faithfulness.items()
            for fraction, count, value in zip(self.fractions, self.edges, values, strict=True)
        ]
        return pd.DataFrame(rows, columns=["method", "percent_edges", "edges", "faithfulness"])

    def summary(self) -> dict[str, Any]:
        """The settings, counts, metrics and areas, for ``summary.json``."""
        return {
            "method": self.method,
            "metric": self.metric,
            "direction": self.direction,
            "ig_steps": self.ig_steps,
            "ablation": self.ablation,
            "model": self.model,
            "pairs": self.pairs,
            "nodes": len(self.graph.upstream) + 1,
            "edges": self.graph.edge_count,
            **self.areas(),
            "clean_metric": self.clean_metric,
            "corrupted_metric": self.corrupted_metric,
            "full_metric": self.full_metric,
            "empty_metric": self.empty_metric,
            "seed": self.seed,
            "layers": self.graph.layers,
            "heads": self.graph.heads,
            "key_value_heads": self.graph.key_value_heads,
            "ranking": "absolute score",
        }

    def mib_json(self) -> dict[str, Any]:
        """The scored graph in MIB's circuit format (every edge ``in_graph``, as MIB's attribution saves
        it before a circuit size is chosen)."""
        return self.graph.to_mib_json(self.scores, self.graph.real)


def check_circuit_options(
    loaded: LoadedModel, method: str, ablation: str, direction: str, metric: str, ig_steps: int
) -> None:
    """Refuse an unknown method, ablation, direction or metric, fewer than one IG step, or a model the graph
    does not fit (no head, layers that share their weights, node inputs bertology cannot rebuild, as the
    sandwich-normed layers of Gemma 2 and 3, a post-norm encoder whose norms bertology does not know).

    Raises:
        BertologyError: as said.
    """
    patching_metric(metric)
    for value, allowed, name in (
        (method, CIRCUIT_METHODS, "method"),
        (ablation, CIRCUIT_ABLATIONS, "ablation"),
        (direction, PATCH_DIRECTIONS, "direction"),
    ):
        if value not in allowed:
            raise BertologyError(f"Unknown circuit {name} {value!r}; choose one of {', '.join(allowed)}.")
    if ig_steps < 1:
        raise BertologyError(f"--ig-steps must be at least 1; {ig_steps} was given.")
    if loaded.model.base_model is loaded.model:
        raise BertologyError(
            f"{loaded.name} has no head: circuits end at logits, so load a language model or a classifier."
        )
    if shares_layers(loaded.model):
        raise BertologyError(f"{loaded.name} shares one layer's weights across layers; use a model without.")
    circuit_stages(loaded, circuit_graph(loaded))
    for site in ("q_input", "mlp_in"):  # every node input is rebuilt at such a site
        try:
            require_site(loaded.model, site)
        except BertologyError as error:
            raise BertologyError(
                f"Circuits rebuild every node's input, which {loaded.name} refuses: {error}"
            ) from None


def circuit(
    loaded: LoadedModel,
    pairs: Sequence[PatchPair] | str | Path,
    *,
    method: CircuitMethod = "eap-ig",
    ig_steps: int = 5,
    metric: PatchMetric = "logit-diff",
    direction: PatchDirection = "noising",
    ablation: CircuitAblation = "counterfactual",
    prepend_bos: bool = False,
    seed: int = 0,
    on_progress: Progress | None = None,
) -> CircuitResult:
    """Score every edge of ``loaded``'s graph on ``pairs`` (:class:`PatchPair` or a pairs file) with
    ``method`` (``eap``, ``eap-ig`` with ``ig_steps`` points, or ``exact``), then measure the faithfulness of
    the top edges at MIB's sizes, for the method's ranking and a random one drawn with ``seed``.

    ablation: what an edge outside a circuit carries, the source run's value (``counterfactual``) or its
        mean (``mean``). direction, metric, prepend_bos: as ``bertology patch``.
    on_progress: told the steps done: the scoring passes (edges for ``exact``), then the circuits measured.

    Raises:
        BertologyError: an unknown option, a model the graph does not fit, or pairs the model cannot read.
    """
    require_single_stack(loaded, "Circuit discovery")
    check_circuit_options(loaded, method, ablation, direction, metric, ig_steps)
    chosen, encoded = load_pairs(loaded, pairs, prepend_bos)
    graph = circuit_graph(loaded)
    sizes = len(FRACTIONS)
    per_group = graph.edge_count if method == "exact" else (ig_steps if method == "eap-ig" else 1)
    total = per_group * len(encoded.groups) + 2 * sizes + 1
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    scores = torch.zeros(len(graph.upstream), len(graph.downstream))
    with torch.inference_mode(False), eval_mode(loaded):
        runs = []
        for group in encoded.groups:
            run = circuit_runs(loaded, group, direction, metric, method, ig_steps)
            runs.append(run)
            if method == "exact":
                scores += exact_scores(loaded, run, step).cpu()
            else:
                scores += attribution_scores(loaded, run).cpu()
                done += per_group - 1
                step()
        pair_count = len(chosen)
        mean = {
            name: sum(float(run.metric(name).sum()) for run in runs) / pair_count
            for name in ("clean", "corrupted")
        }
        carried = replacements(runs, ablation)
        real = graph.real
        target = runs[0].target
        empty = empty_metric(loaded, runs, carried, ablation)
        step()
        table = (scores / pair_count).numpy()
        orders = {method: ranking(table, real), RANDOM: random_ranking(real, seed)}
        faithfulness = {
            name: curve(loaded, runs, carried, order, graph, mean[target], empty, step)
            for name, order in orders.items()
        }
    return CircuitResult(
        graph=graph,
        scores=table,
        method=method,
        metric=metric,
        direction=direction,
        ablation=ablation,
        ig_steps=ig_steps if method == "eap-ig" else None,
        model=loaded.name,
        pairs=pair_count,
        seed=seed,
        fractions=FRACTIONS,
        edges=edge_counts(graph.edge_count),
        faithfulness=faithfulness,
        clean_metric=mean["clean"],
        corrupted_metric=mean["corrupted"],
        full_metric=mean[target],
        empty_metric=empty,
    )
