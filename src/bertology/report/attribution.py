"""The page of ``bertology attribute``: one input's self-attention attribution (Hao et al. 2021), its
attribution tree as inline SVG (the template ``attribution_tree.html.j2``, tokens escaped by its
autoescape), the heads' scores, the strongest interactions and the completeness of each layer's integral.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from markupsafe import Markup

from bertology.files.outputs import write_text
from bertology.interventions.attention_attribution import AttentionAttribution
from bertology.interventions.attribution_tree import AttributionTree
from bertology.report import page, plots
from bertology.report.page import render
from bertology.stats.base import HeadTable

CHAR_WIDTH = 7.2  # px per character of the 12 px token font
GAP = 16.0  # px between tokens
LEVEL = 64.0  # px between depths of the tree
TOP = 12.0  # px above the root
ROOT_FILL, NODE_FILL = "#cf222e", "#0969da"

TREE_TEXT = (
    "Attr(A) = A ⊙ ∫₀¹ ∂F(αA)/∂A dα for every head's attention map A, F the probability of the attributed "
    "label with only that layer's attention scaled by α (Hao et al. 2021). The tree follows the paper's "
    "construction: each layer's attribution summed over heads and divided by its largest entry; "
    "interactions above the threshold join the tree from the top layer down, each token once."
)
COMPLETENESS_TEXT = (
    "Per layer, the attributions sum to F(A) − F(0·A), the probability lost when every head of the layer "
    "outputs 0, up to the error of the integral (the paper's Riemann sum errs by about 1/steps of the "
    "change; Gauss-Legendre far less)."
)


@dataclass(frozen=True)
class _Node:
    x: str
    left: str
    top: str
    width: str
    baseline: str
    text: str
    fill: str


@dataclass(frozen=True)
class _Edge:
    x1: str
    y1: str
    x2: str
    y2: str
    label_x: str
    label_y: str
    label: str
    title: str
    opacity: str


def tree_svg(tokens: list[str], tree: AttributionTree) -> Markup:
    """The attribution tree as an ``<svg>`` in a ``<figure>``: the tokens of the tree in input order, each at
    its depth (the root on top); each edge points from the key token up to the query token that took its
    information in that layer (0-based), darker for a larger normalised attribution."""
    depth = tree.depth
    order = sorted(depth)
    centres, x = {}, GAP
    for position in order:
        width = max(len(tokens[position]), 1) * CHAR_WIDTH + 8
        centres[position] = (x + width / 2, width)
        x += width + GAP
    nodes = [
        _Node(
            x=f"{centres[p][0]:.1f}",
            left=f"{centres[p][0] - centres[p][1] / 2:.1f}",
            top=f"{TOP + depth[p] * LEVEL:.1f}",
            width=f"{centres[p][1]:.1f}",
            baseline=f"{TOP + depth[p] * LEVEL + 14:.1f}",
            text=tokens[p],
            fill=ROOT_FILL if p == tree.root else NODE_FILL,
        )
        for p in order
    ]
    edges = []
    for edge in tree.edges:
        x1, y1 = centres[edge.key][0], TOP + depth[edge.key] * LEVEL
        x2, y2 = centres[edge.query][0], TOP + depth[edge.query] * LEVEL + 22
        edges.append(
            _Edge(
                x1=f"{x1:.1f}",
                y1=f"{y1:.1f}",
                x2=f"{x2:.1f}",
                y2=f"{y2:.1f}",
                label_x=f"{(x1 + x2) / 2:.1f}",
                label_y=f"{(y1 + y2) / 2 - 3:.1f}",
                label=f"layer {edge.layer}",
                title=f"{tokens[edge.query]} ← {tokens[edge.key]}: {edge.score:.2f} in layer {edge.layer}",
                opacity=f"{0.35 + 0.65 * min(edge.score, 1.0):.2f}",
            )
        )
    height = TOP + (max(depth.values()) + 1) * LEVEL
    caption = (
        f"Attribution tree (threshold {tree.threshold:g} of each layer's largest attribution); root "
        f"'{tokens[tree.root]}' in red. An arrow points from the token whose information was taken to the "
        "token that took it, in the layer written beside it (0-based)."
    )
    return Markup(
        render(
            "attribution_tree.html.j2",
            width=f"{x:.0f}",
            height=f"{height:.0f}",
            nodes=nodes,
            edges=edges,
            caption=caption,
        )
    )


def _head_scores_png(attribution: AttentionAttribution, dpi: int) -> bytes:
    table = HeadTable(
        columns={"largest attribution": attribution.head_scores}, defined_segments={}, segments=1
    )
    figure = plots.heatmaps(table, ["largest attribution"], unit="max Attr (probability)")
    return plots.to_png(figure, dpi=dpi)


def write_attribution(
    attribution: AttentionAttribution, path: str | Path, *, threshold: float = 0.4, dpi: int = 110
) -> tuple[Path, Path]:
    """Write ``attribution`` as an HTML page at ``path`` and as JSON beside it (same name, ``.json``: the
    summary of :meth:`~bertology.interventions.attention_attribution.AttentionAttribution.to_dict` and
    ``layer_attribution``, ``[layers, n, n]`` each layer's attribution summed over heads); return both."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    json_path = target.with_suffix(".json")
    content = attribution.to_dict(threshold)
    content["layer_attribution"] = attribution.attribution.sum(axis=1).tolist()
    write_text(json_path, json.dumps(content, ensure_ascii=False))
    tree = attribution.tree(threshold)
    tokens = attribution.tokens
    edges = pd.DataFrame(
        {
            "layer": [edge.layer for edge in tree.edges],
            "query token (took)": [f"{tokens[edge.query]} ({edge.query})" for edge in tree.edges],
            "key token (gave)": [f"{tokens[edge.key]} ({edge.key})" for edge in tree.edges],
            "normalised attribution": [edge.score for edge in tree.edges],
        }
    )
    gap = attribution.completeness_gap
    layers = pd.DataFrame(
        {
            "layer": np.arange(len(gap)),
            "Σ Attr(A)": attribution.attribution.sum(axis=(1, 2, 3)),
            "F(A) − F(0·A)": attribution.probability - attribution.zeroed,
            "gap": gap,
        }
    )
    header = [
        page.definitions(
            {
                "text": attribution.text,
                "second text": attribution.text_b,
                "attributed label": attribution.label,
                "predicted label": attribution.predicted,
                "F(A): its probability": round(attribution.probability, 4),
                "integral": f"{attribution.rule}, {attribution.steps} steps",
                "largest completeness gap": f"{float(np.abs(gap).max()):.2g}",
                "seconds": round(attribution.seconds, 1),
            }
        )
    ]
    sections = [
        page.Section(
            "Attribution tree",
            "tree",
            [
                page.paragraph(TREE_TEXT),
                tree_svg(tokens, tree),
                page.table(edges, float_format="{:.3f}"),
            ],
        ),
        page.Section(
            "Heads",
            "heads",
            [
                page.paragraph(
                    "Each head's largest attribution (the paper's head score; averaged over a task's dev set "
                    "it ranks heads for pruning: bertology ablate)."
                ),
                page.figure(_head_scores_png(attribution, dpi), alt="largest attribution per head"),
            ],
        ),
        page.Section(
            "Strongest interactions",
            "interactions",
            [page.table(attribution.top_interactions(20), float_format="{:.4g}")],
        ),
        page.Section(
            "Completeness",
            "completeness",
            [
                page.paragraph(COMPLETENESS_TEXT),
                page.table(layers, float_format="{:.4g}"),
            ],
        ),
    ]
    write_text(target, page.render_page("Self-attention attribution", sections, header=header))
    return target, json_path
