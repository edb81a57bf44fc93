"""A circuit run's folder as ``bertology circuit`` writes it (``edges.csv``, ``faithfulness.csv``,
``summary.json``, its mark), over every edge of MIB's graph of a small model, with seeded scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bertology.files.run_files import mark_run

LAYERS, HEADS = 2, 3
#: MIB's sizes as faithfulness.csv gives them: percent of the edges (its edge count: that share, rounded
#: down). 1 %: no edge at all (0.75 of the 75 edges of a 2 x 3 graph).
PERCENTS = (1.0, 10.0, 50.0, 100.0)


def mib_edges(layers: int, heads: int, key_value_heads: int | None = None) -> list[tuple[str, str]]:
    """Every edge of MIB's graph of ``layers`` x ``heads``: from each node to every later node's input, a
    head's input once per kind (q, k, v; with ``key_value_heads``, grouped-query attention, the keys' and
    values' once per key/value head, ``a1.h{j}<k>``); an MLP follows its layer's heads."""
    earlier = ["input"]
    edges = []
    for layer in range(layers):
        names = [f"a{layer}.h{head}" for head in range(heads)]
        shared = heads if key_value_heads is None else key_value_heads
        for head, name in enumerate(names):
            kinds = "qkv" if head < shared else "q"
            edges += [(up, f"{name}<{kind}>") for kind in kinds for up in earlier]
        edges += [(up, f"m{layer}") for up in earlier + names]
        earlier += [*names, f"m{layer}"]
    return edges + [(up, "logits") for up in earlier]


def write_run(
    folder: Path,
    *,
    model: str = "tiny",
    layers: int = LAYERS,
    heads: int = HEADS,
    key_value_heads: int | None = None,
    seed: int = 0,
) -> list[tuple[str, str, float]]:
    """A circuit run of ``model`` in ``folder`` (marked, with its three files) over every edge of MIB's
    graph of ``layers`` x ``heads`` (``key_value_heads``: :func:`mib_edges`), with seeded scores of both
    signs; returns its edges by |score|, largest first (edges.csv's order)."""
    folder.mkdir(parents=True, exist_ok=True)
    edges = mib_edges(layers, heads, key_value_heads)
    scores = np.random.default_rng(seed).normal(size=len(edges))
    ranked = sorted(
        ((up, down, float(score)) for (up, down), score in zip(edges, scores, strict=True)),
        key=lambda edge: -abs(edge[2]),
    )
    rows = "".join(f"{up},{down},{score!r}\n" for up, down, score in ranked)
    (folder / "edges.csv").write_text("upstream,downstream,score\n" + rows, encoding="utf-8")
    lines = ["method,percent_edges,edges,faithfulness"]
    for method, base in (("eap-ig", 0.5), ("random", 0.1)):
        for step, percent in enumerate(PERCENTS):
            lines.append(f"{method},{percent},{int(percent / 100 * len(edges))},{base + 0.2 * step}")
    (folder / "faithfulness.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = {
        "method": "eap-ig",
        "metric": "logit-diff",
        "direction": "noising",
        "model": model,
        "pairs": 2,
        "edges": len(edges),
        "cpr": {"eap-ig": 0.7, "random": 0.3},
        "cmd": {"eap-ig": 0.3, "random": 0.7},
    }
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    mark_run(folder, "circuit", model=model)
    return ranked
