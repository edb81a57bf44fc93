"""A circuit run's page, ``circuit.html``: the circuit at a chosen size as an interactive graph.

It reads the run's ``edges.csv``, ``faithfulness.csv`` and ``summary.json``
(:mod:`bertology.interventions.circuit_edges`) and draws MIB's graph: ``input`` on the left, each layer's
heads in a column (head 0 at the top) with its MLP in the next column, ``logits`` on the right. A slider goes
over the sizes of ``faithfulness.csv`` (the method's, ``summary.json``'s ``method``); the circuit at a size is
the first ``edges`` rows of ``edges.csv`` by ``|score|`` (MIB's top ``percent_edges`` %), drawn (its strongest
:data:`MOST_DRAWN_EDGES`) with width by ``|score|`` and red for a positive score, blue for a negative one; the
page says its faithfulness and the random ranking's at that size. A click on a node lists its strongest edges
in and out of the circuit, and on a head draws its attention on one clean and one corrupted input
(:func:`~bertology.interventions.circuit_attention.circuit_attention`, embedded as 8-bit codes).

Like the view pages, the page is one file that loads nothing: its script (``templates/circuit.js``) and
style are inline, its data travels in a ``type="application/json"`` block with ``<``, ``>`` and ``&``
escaped (:func:`~bertology.views.payload.script_json`), and the script inserts every name and token as
text (``textContent``), never as markup. Its Content-Security-Policy runs that one
script, by hash (:func:`circuit_script_hash`), which the web app allows for the runs folder's files too.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup

from bertology.attention.capturing import Attention
from bertology.errors import BertologyError
from bertology.files.run_files import CIRCUIT_PAGE_FILE, EDGES_FILE, FAITHFULNESS_FILE, SUMMARY_FILE
from bertology.interventions.circuit_attention import PairAttention, circuit_attention
from bertology.interventions.circuit_edges import (
    NODE_NAME,
    graph_shape,
    key_value_groups,
    read_edges,
    read_faithfulness,
)
from bertology.interventions.patching_pairs import PatchPair
from bertology.models.loading import LoadedModel
from bertology.report.page import definitions, render
from bertology.views.bertviz import prettify
from bertology.views.payload import quantise_attention, script_json

#: The method ``faithfulness.csv`` compares every method with.
RANDOM = "random"
#: The most edges the page draws of a circuit (its strongest): drawing more takes seconds (123,211 edges,
#: smollm2-135m's whole graph: about 10 s in headless Chromium on a shared CPU) and adds only faint lines.
MOST_DRAWN_EDGES = 20_000
#: The size the page opens on: the first of the method's sizes with at least this many percent of edges.
OPENING_PERCENT = 5.0


@cache
def circuit_script() -> str:
    """The page's script, ``templates/circuit.js``."""
    return files("bertology.report").joinpath("templates", "circuit.js").read_text(encoding="utf-8")


@cache
def circuit_script_hash() -> str:
    """The CSP source that allows the page's inline script and nothing else: ``'sha256-...'``."""
    digest = hashlib.sha256(circuit_script().encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def page_policy() -> str:
    """The page's Content-Security-Policy: its own script (by hash), inline style, nothing loaded."""
    return (
        f"default-src 'none'; script-src {circuit_script_hash()}; style-src 'unsafe-inline'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def _place(node: str, layers: int, heads: int) -> tuple[float, float]:
    """``(column, row)`` of the node ``node`` in a graph of ``layers`` x ``heads``: ``input`` in column 0,
    layer ``l``'s heads in column ``1 + 2l`` (row = head) and its MLP in ``2 + 2l``, ``logits`` last;
    input, MLPs and logits in the middle row."""
    middle = (heads - 1) / 2
    match = NODE_NAME.fullmatch(node)
    assert match is not None  # read_edges checked every name
    if match["layer"] is not None:
        return 1 + 2 * int(match["layer"]), float(match["head"])
    if match["mlp"] is not None:
        return 2 + 2 * int(match["mlp"]), middle
    return (0 if node == "input" else 1 + 2 * layers), middle


def graph_data(edges: pd.DataFrame) -> dict[str, Any]:
    """The nodes (name, column, row) and edges (indices into the nodes, the downstream input's kind, score;
    by ``|score|`` largest first) of ``edges`` (:func:`~bertology.interventions.circuit_edges.read_edges`),
    and how many query heads read each key/value head (``groups``: a key or value input's node is its
    key/value head's name, ``a5.h1`` for ``a5.h1<k>``, which the page draws into the heads that read it)."""
    names = pd.unique(pd.concat([edges["upstream"], edges["downstream"]], ignore_index=True))
    layers, heads = graph_shape(edges)
    heads = max(heads, 1)
    index = {name: position for position, name in enumerate(names)}
    nodes = [[str(name), *_place(str(name), layers, heads)] for name in names]
    return {
        "layers": layers,
        "heads": heads,
        "nodes": nodes,
        "upstream": [index[name] for name in edges["upstream"]],
        "downstream": [index[name] for name in edges["downstream"]],
        "kinds": "".join(kind or "." for kind in edges["kind"]),
        "groups": key_value_groups(edges),
        "scores": [float(f"{score:.7g}") for score in edges["score"]],  # EAP's scores can be tiny
    }


def sizes(faithfulness: pd.DataFrame, method: str) -> list[dict[str, Any]]:
    """The slider's stops: each size of ``method`` in ``faithfulness`` (smallest first) with its edge
    count, its faithfulness and the random ranking's at the same ``percent_edges`` (``None`` if absent)."""
    mine = faithfulness[faithfulness["method"] == method].sort_values("percent_edges", kind="stable")
    random = faithfulness[faithfulness["method"] == RANDOM].set_index("percent_edges")["faithfulness"]
    random = random[~random.index.duplicated()]
    return [
        {
            "percent": float(row.percent_edges),
            "edges": int(row.edges),
            "faithfulness": float(row.faithfulness),
            "random": float(random[row.percent_edges]) if row.percent_edges in random.index else None,
        }
        for row in mine.itertuples(index=False)
    ]


def attention_data(attention: Attention) -> dict[str, Any]:
    """One input's heatmaps for the page: its tokens (as the views show them) and ``probs [layers, heads,
    n, n]`` as 8-bit codes (``round(p * 255)``), base64."""
    codes = quantise_attention(attention.probs)
    return {
        "tokens": [prettify(token) for token in attention.tokens],
        "shape": list(codes.shape),
        "codes": base64.b64encode(np.ascontiguousarray(codes).tobytes()).decode("ascii"),
    }


def _read_summary(run_dir: Path) -> dict[str, Any]:
    """The run's ``summary.json``, a JSON object with a ``method``.

    Raises:
        BertologyError: missing, not JSON, not an object or without a method (named).
    """
    path = run_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise BertologyError(f"The circuit run's {path} cannot be read as JSON ({error}).") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("method"), str):
        raise BertologyError(f"The circuit run's {path} is not a JSON object with a method.")
    return summary


def _header(summary: dict[str, Any]) -> Markup:
    """The page's metadata: the model, method, metric and counts, and CPR / CMD of each method."""
    shown = {
        key: summary[key]
        for key in (
            "model",
            "method",
            "metric",
            "direction",
            "ig_steps",
            "ablation",
            "pairs",
            "nodes",
            "edges",
        )
        if isinstance(summary.get(key), str | int | float)
    }
    for score in ("cpr", "cmd"):
        values = summary.get(score)
        if isinstance(values, dict):
            shown[score.upper()] = ", ".join(
                f"{method} {value:.3f}" for method, value in values.items() if isinstance(value, int | float)
            )
    return definitions(shown)


def write_circuit_page(run_dir: str | Path, attention: PairAttention | None = None) -> Path:
    """Write ``circuit.html`` into the circuit run ``run_dir`` from its ``edges.csv``,
    ``faithfulness.csv`` and ``summary.json`` (module docstring) and return it; ``attention``: the heads'
    attention on one clean and one corrupted input (:func:`circuit_attention`), drawn when a head is
    clicked (without it the page says none was embedded).

    Raises:
        BertologyError: a missing or damaged file of the run (named), or a method with no sizes in
            ``faithfulness.csv``.
    """
    folder = Path(run_dir)
    summary = _read_summary(folder)
    method = summary["method"]
    for name in (EDGES_FILE, FAITHFULNESS_FILE):
        if not (folder / name).is_file():
            raise BertologyError(f"The circuit run '{folder}' has no {name}.")
    edges = read_edges(str(folder / EDGES_FILE), str(folder / EDGES_FILE))
    stops = sizes(read_faithfulness(str(folder / FAITHFULNESS_FILE), str(folder / FAITHFULNESS_FILE)), method)
    if not stops:
        raise BertologyError(f"{folder / FAITHFULNESS_FILE} has no sizes of the method {method!r}.")
    opening = next((i for i, stop in enumerate(stops) if stop["percent"] >= OPENING_PERCENT), len(stops) - 1)
    data = {
        "method": method,
        "graph": graph_data(edges),
        "sizes": stops,
        "opening": opening,
        "mostDrawn": MOST_DRAWN_EDGES,
        "attention": None
        if attention is None
        else {"clean": attention_data(attention.clean), "corrupted": attention_data(attention.corrupted)},
    }
    model = summary.get("model")
    title = f"Circuit: {model}" if isinstance(model, str) else "Circuit"
    html = render(
        "circuit.html.j2",
        title=title,
        policy=page_policy(),
        header=_header(summary),
        data=Markup(script_json(data)),
        script=Markup(circuit_script()),
    )
    target = folder / CIRCUIT_PAGE_FILE
    target.write_text(html, encoding="utf-8")
    return target


def finish_circuit_run(
    run_dir: str | Path, model: LoadedModel, pair: PatchPair, prepend_bos: bool = False
) -> Path:
    """The command line's last step of ``bertology circuit``: write the run's page with every head's
    attention on ``pair``'s clean and corrupted text (the pairs file's first, say), tokenized as the run
    read them (``prepend_bos``: the run's option)."""
    attention = circuit_attention(model, pair.clean, pair.corrupted, prepend_bos=prepend_bos)
    return write_circuit_page(run_dir, attention)
