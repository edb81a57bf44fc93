"""The files of a circuit run (``bertology circuit``), each in a fixed format:

- ``edges.csv``: ``upstream``, ``downstream``, ``score`` (MIB names: ``input``, ``a3.h1``, ``a5.h2<q>``,
  ``m4``, ``logits``), by absolute score from the largest;
- ``faithfulness.csv``: ``method``, ``percent_edges``, ``edges``, ``faithfulness`` (``method``: the scoring
  method's name, and ``random``);
- ``summary.json``: the settings, counts, metrics, and CPR and CMD per ranking
  (:meth:`~bertology.interventions.circuit.CircuitResult.summary`);
- ``graph.json``: the scored graph in MIB's circuit format (``eap.graph.Graph.to_json``);
- ``curves.png``: faithfulness against the percentage of edges kept (log axis), the method and random.

The folder is marked as a run of kind ``circuit``; its page (``circuit.html``) is written by
:mod:`bertology.report.circuit` where present.
"""

from __future__ import annotations

import json
from pathlib import Path

from bertology.files.run_files import (
    CURVES_FILE,
    EDGES_FILE,
    FAITHFULNESS_FILE,
    GRAPH_FILE,
    SUMMARY_FILE,
    mark_run,
)
from bertology.interventions.circuit import RANDOM, CircuitResult
from bertology.interventions.patching_metrics import METRICS
from bertology.report import plots


def curves_png(result: CircuitResult, *, dpi: int = 110) -> bytes:
    """The faithfulness curves of ``result`` as a PNG."""
    figure = plots.new_figure(6.0, 4.0)
    ax = figure.add_subplot()
    found = result.areas()
    for name, values in result.faithfulness.items():
        percent = [100 * fraction for fraction in result.fractions]
        style = {"color": "0.55", "linestyle": "--"} if name == RANDOM else {"color": "C0"}
        label = f"{name} (CPR {found['cpr'][name]:.2f}, CMD {found['cmd'][name]:.2f})"
        ax.plot(percent, values, marker="o", markersize=3, label=label, **style)
    ax.axhline(1.0, color="0.8", linewidth=0.8)
    ax.axhline(0.0, color="0.8", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("edges kept (% of the graph's, log scale)")
    ax.set_ylabel(f"faithfulness ({METRICS[result.metric].symbol})")
    ax.set_title(f"{result.model}: circuits of {result.pairs} pairs ({result.ablation} ablation)")
    ax.legend(fontsize=8)
    return plots.to_png(figure, dpi=dpi)


def write_circuit_files(result: CircuitResult, outdir: str | Path) -> Path:
    """Write ``result``'s files into ``outdir`` (module docstring), mark the run, and return the folder."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    result.edges_frame().to_csv(target / EDGES_FILE, index=False)
    result.faithfulness_frame().to_csv(target / FAITHFULNESS_FILE, index=False)
    (target / SUMMARY_FILE).write_text(json.dumps(result.summary(), indent=2), encoding="utf-8")
    (target / GRAPH_FILE).write_text(json.dumps(result.mib_json()), encoding="utf-8")
    (target / CURVES_FILE).write_bytes(curves_png(result))
    mark_run(target, "circuit", model=result.model)
    return target
