"""A circuit run's tables as its page and the explorer read them: MIB's node names, ``edges.csv`` and
``faithfulness.csv`` (:data:`~bertology.files.run_files.EDGES_FILE`,
:data:`~bertology.files.run_files.FAITHFULNESS_FILE`).

The graph is MIB's (Mueller et al. 2025, github.com/hannamw/MIB-circuit-track): nodes ``input``, every
attention head ``a{layer}.h{head}``, every MLP ``m{layer}`` and ``logits``; an edge goes from a node to
a later node's input, a head's input split by kind in the downstream name (``a5.h2<q>``, ``a5.h2<k>``,
``a5.h2<v>``). A circuit of size ``p`` % is the top ``p`` % of the edges by ``|score|``, as MIB ranks
them; ``faithfulness.csv`` names each size's edge count (``edges``).
"""

from __future__ import annotations

import re
from typing import IO, Any

import numpy as np
import pandas as pd

from bertology.errors import BertologyError
from bertology.interventions.circuit_graph import head_node

#: A node's name: ``input``, ``logits``, a head ``a{layer}.h{head}`` or an MLP ``m{layer}``.
NODE_NAME = re.compile(r"input|logits|a(?P<layer>\d+)\.h(?P<head>\d+)|m(?P<mlp>\d+)")
#: An edge's upstream end: any node but ``logits``.
UPSTREAM_NAME = re.compile(r"input|a\d+\.h\d+|m\d+")
#: An edge's downstream end: any node but ``input``, a head's with the kind of its input (``a5.h2<q>``,
#: ``<k>``, ``<v>``).
DOWNSTREAM_NAME = re.compile(r"logits|m\d+|a\d+\.h\d+(?:<[qkv]>)?")

EDGE_COLUMNS = ("upstream", "downstream", "score")
FAITHFULNESS_COLUMNS = ("method", "percent_edges", "edges", "faithfulness")
#: How many in-edges and out-edges of a head :func:`head_edges` lists.
HEAD_EDGES = 5


def _read(source: str | IO[bytes], name: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """The CSV ``source`` (named ``name`` in messages) with at least ``columns``.

    Raises:
        BertologyError: it cannot be read as CSV, or lacks a column.
    """
    try:
        frame = pd.read_csv(source, dtype={"upstream": str, "downstream": str, "method": str})
    except UnicodeDecodeError as error:
        raise BertologyError(f"{name} is not UTF-8 text (byte {error.start}).") from None
    except (OSError, ValueError) as error:
        raise BertologyError(f"{name} cannot be read as CSV ({error}).") from None
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise BertologyError(f"{name} has no {', '.join(missing)} column (it needs {', '.join(columns)}).")
    return frame


def _numbers(frame: pd.DataFrame, column: str, name: str) -> np.ndarray:
    """``frame[column]`` as finite float64.

    Raises:
        BertologyError: a value that is no finite number (its row named, 1-based after the header).
    """
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = int(bad[0])
        value = str(frame[column].iloc[row])
        raise BertologyError(f"{name} row {row + 1} has {column} {value!r}, which is not a finite number.")
    return values


def _check_names(names: pd.Series, pattern: re.Pattern[str], name: str, column: str) -> None:
    """Every entry of ``names`` fully matches ``pattern``.

    Raises:
        BertologyError: the first that does not (its row and value named).
    """
    text = names.fillna("").astype(str)
    bad = ~text.str.fullmatch(pattern.pattern)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise BertologyError(
            f"{name} row {row + 1} has {column} {text.iloc[row]!r}, which is not a {column} node of MIB's "
            "graph (input, a{layer}.h{head}, m{layer}, logits; a head's input as a{layer}.h{head}<q>, <k> "
            "or <v>)."
        )


def read_edges(source: str | IO[bytes], name: str = "edges.csv") -> pd.DataFrame:
    """``edges.csv`` (a path or a binary file, ``name`` in messages) as a frame of ``upstream``,
    ``downstream`` (with the kind split off), ``kind`` (``"q"``, ``"k"``, ``"v"`` or ``""``) and ``score``,
    sorted by ``|score|`` largest first (stable: the file's order among equal sizes).

    Raises:
        BertologyError: not CSV, a missing column, a score that is no finite number, a name that is not
            one of MIB's nodes (each named with its row).
    """
    frame = _read(source, name, EDGE_COLUMNS)
    score = _numbers(frame, "score", name)
    _check_names(frame["upstream"], UPSTREAM_NAME, name, "upstream")
    _check_names(frame["downstream"], DOWNSTREAM_NAME, name, "downstream")
    split = frame["downstream"].str.extract(r"^(?P<node>[^<]*)(?:<(?P<kind>[qkv])>)?$")
    order = np.argsort(-np.abs(score), kind="stable")
    edges = pd.DataFrame(
        {
            "upstream": frame["upstream"].astype(str).to_numpy(),
            "downstream": split["node"].to_numpy(),
            "kind": split["kind"].fillna("").to_numpy(),
            "score": score,
        }
    )
    return edges.iloc[order].reset_index(drop=True)


def read_faithfulness(source: str | IO[bytes], name: str = "faithfulness.csv") -> pd.DataFrame:
    """``faithfulness.csv`` (``method``, ``percent_edges``, ``edges``, ``faithfulness``) with ``edges`` as
    whole numbers.

    Raises:
        BertologyError: not CSV, a missing column, a value that is no (whole, for ``edges``) number.
    """
    frame = _read(source, name, FAITHFULNESS_COLUMNS)
    for column in ("percent_edges", "faithfulness"):
        frame[column] = _numbers(frame, column, name)
    edges = _numbers(frame, "edges", name)
    bad = np.flatnonzero((edges < 0) | (edges != np.round(edges)))
    if bad.size:
        row = int(bad[0])
        raise BertologyError(f"{name} row {row + 1} has edges {edges[row]:g}, which is not a whole number.")
    frame["edges"] = edges.astype(np.int64)
    frame["method"] = frame["method"].astype(str)
    return frame


def graph_shape(edges: pd.DataFrame) -> tuple[int, int]:
    """``(layers, heads)`` that the nodes of ``edges`` (:func:`read_edges`) span: one more than the largest
    layer of a head or MLP and than the largest head (0 where there is none)."""
    layers, heads = 0, 0
    for name in pd.unique(pd.concat([edges["upstream"], edges["downstream"]], ignore_index=True)):
        match = NODE_NAME.fullmatch(str(name))
        if match is not None and match["layer"] is not None:
            layers, heads = max(layers, int(match["layer"]) + 1), max(heads, int(match["head"]) + 1)
        elif match is not None and match["mlp"] is not None:
            layers = max(layers, int(match["mlp"]) + 1)
    return layers, heads


def key_value_groups(edges: pd.DataFrame) -> int:
    """How many query heads read each key/value head in the graph of ``edges`` (:func:`read_edges`): its
    heads (:func:`graph_shape`) over its key/value heads, one more than the largest head a key or value
    input names (``a5.h1<k>`` is key/value head 1 under grouped-query attention); 1 where none does."""
    _, heads = graph_shape(edges)
    shared = edges["downstream"][edges["kind"].isin(["k", "v"])]
    if shared.empty:
        return 1
    key_value_heads = int(shared.str.extract(r"\.h(\d+)$")[0].astype(int).max()) + 1
    return max(1, heads // key_value_heads)


def head_edges(edges: pd.DataFrame, layer: int, head: int, count: int = HEAD_EDGES) -> dict[str, Any]:
    """The ``count`` edges into and out of the head ``(layer, head)`` of largest ``|score|`` (``edges`` as
    :func:`read_edges` gives them): ``{"into": [...], "out": [...]}``, each edge ``{"node": the other end,
    "kind": the input of the edge's downstream head it reaches ("q", "k", "v"; "" for an MLP or the
    logits), "score", "rank": its place in the whole ranking, 1-based (the circuit of n edges holds the
    ranks up to n)}``. The edges into a head are those into its query and into its key/value head's key and
    value (under grouped-query attention shared with the group's other heads, :func:`key_value_groups`);
    an edge out of it into another layer's key or value names that key/value head, as MIB does."""
    node = head_node(layer, head)
    shared = edges["kind"].isin(["k", "v"])
    own = head_node(layer, head // key_value_groups(edges))
    reads = ((edges["downstream"] == node) & ~shared) | ((edges["downstream"] == own) & shared)

    def listed(rows: pd.DataFrame, other: str) -> list[dict[str, Any]]:
        top = rows.head(count)
        return [
            {"node": str(end), "kind": str(kind), "score": float(score), "rank": int(rank) + 1}
            for end, kind, score, rank in zip(top[other], top["kind"], top["score"], top.index, strict=True)
        ]

    return {
        "into": listed(edges[reads], "upstream"),
        "out": listed(edges[edges["upstream"] == node], "downstream"),
    }
