"""The explorer: an analysis folder of the runs folder (``bertology analyze`` output) as live data.

It reads what ``analyze`` wrote, and never runs a model: ``heads.csv`` (every head's statistics, label
and pattern scores), ``head_js_divergence.csv`` (the heads' mean Jensen-Shannon divergences, for the map
and the nearest heads), ``summary.json`` (the seed of the map) and, where present,
``head_examples.npz`` (each head's top examples with its attention,
:mod:`bertology.analysis.examples`). Results of other commands for the same heads that sit next to
the analysis (in its folder, or in its parent folder, up to :data:`RELATED_DEPTH` levels down) are
joined in when their layer x head grid is the analysis's: a dependency probe (``accuracies.csv`` with a
``relation`` column and ``table.csv``), a coreference probe (``accuracies.csv`` with a ``type``
column) and an ablation (``ablation.csv``, and ``importance.csv`` when there). An ablation names the
model it removed heads from (its ``summary.json``): one of the analysis's own model is preferred, and one
of another model (say, the classifier fine-tuned from it) is joined with that model's name, so the page
can say whose heads it measured. A patching run (``bertology patch``, ``head_effects.csv``) of the analysis's
own model is joined in too: each head's patching effect and its rank; and so is a circuit run
(``bertology circuit``, ``edges.csv``) of that model, or ``edges.csv`` in the analysis's own folder: each
head's strongest edges in and out (:func:`~bertology.interventions.circuit_edges.head_edges`).

Every file is opened below the analysis folder's descriptor without following links
(:mod:`bertology.files.beneath`; a symbolic link is refused, 403) and read from that descriptor, so no file
outside the runs folder is ever read. A folder's data is kept, with the size and modification time of
the files it was read from, and read again when they change.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bertology.analysis.distances import mds_embedding
from bertology.analysis.examples import EXAMPLES_FILE, HeadExamples
from bertology.analysis.patterns import LABEL_DESCRIPTIONS, OTHER_PATTERN_COLOUR, PATTERN_COLOURS
from bertology.attention.capturing import Attention
from bertology.errors import BertologyError
from bertology.files.beneath import OpenFolder, path_parts
from bertology.files.run_files import EDGES_FILE, HEADS_FILE, JS_DIVERGENCE_FILE, SUMMARY_FILE
from bertology.interventions.circuit_edges import graph_shape, head_edges, read_edges
from bertology.interventions.patch_grid import GRIDS
from bertology.server.errors import RequestError, shown
from bertology.server.runs import RunsFolder
from bertology.views import View
from bertology.views.build import view_data

#: How many nearest heads (by mean JS divergence) a head lists.
NEAREST = 5
#: How many relations (dependency probe) a head lists, its largest gain over the baseline first.
RELATIONS = 5
#: How deep below the analysis's parent folder related results are looked for.
RELATED_DEPTH = 2
#: Most analysis folders kept in memory.
CACHE_RUNS = 16

_HEAD_KEYS = ("layer", "head")
_NOT_STATISTICS = {"layer", "head", "label", "label_segment"}


def _finite(value: Any) -> float | None:
    """``value`` as a float, ``None`` for NaN or infinity (JSON has neither)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _grid(values: np.ndarray) -> list[list[float | None]]:
    return [[_finite(value) for value in row] for row in values]


def _head_grid(frame: pd.DataFrame, column: str, layers: int, heads: int) -> np.ndarray | None:
    """``[layers, heads]`` of ``column`` from a one-row-per-head frame, ``None`` when the frame's heads
    are not exactly that grid."""
    if (
        not set(_HEAD_KEYS) <= set(frame.columns)
        or column not in frame.columns
        or len(frame) != layers * heads
    ):
        return None
    grid = np.full((layers, heads), np.nan)
    layer, head = frame["layer"].to_numpy(), frame["head"].to_numpy()
    if layer.min() < 0 or head.min() < 0 or layer.max() >= layers or head.max() >= heads:
        return None
    grid[layer, head] = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    return grid


@dataclass(frozen=True)
class Ablation:
    """An ablation folder's per-head results: each ``[layers, heads]``."""

    path: str  # relative to the runs folder
    model: str | None  # the model its heads were removed from (its summary.json), None when unknown
    change: np.ndarray  # dev accuracy without the head minus with every head
    accuracy: np.ndarray  # dev accuracy without the head
    importance: np.ndarray | None  # Michel et al.'s head importance, when computed


@dataclass(frozen=True)
class Patching:
    """A patching folder's per-head effects, ``[layers, heads]`` (1: the head restores all of the clean
    behaviour), and its direction, method and ablation (its ``summary.json``; ``counterfactual``:
    patching, ``zero`` or ``mean``: ablation)."""

    path: str  # relative to the runs folder
    effect: np.ndarray
    direction: str
    method: str
    ablation: str = "counterfactual"


@dataclass(frozen=True)
class Circuit:
    """A circuit folder's edges (:func:`~bertology.interventions.circuit_edges.read_edges`: by ``|score|``,
    largest first) and the method that scored them (its ``summary.json``)."""

    path: str  # relative to the runs folder
    method: str
    edges: pd.DataFrame


@dataclass
class Related:
    """Results of other commands for the analysis's heads (module docstring); paths relative to the runs
    folder."""

    dependency: tuple[str, pd.DataFrame, pd.DataFrame] | None = None  # path, accuracies, table
    coreference: tuple[str, pd.DataFrame] | None = None  # path, accuracies
    ablation: Ablation | None = None
    patching: Patching | None = None
    circuit: Circuit | None = None


@dataclass
class AnalysisRun:
    """One analysis folder, read (module docstring)."""

    path: str
    summary: dict[str, Any]
    heads: pd.DataFrame
    labels: np.ndarray  # [layers, heads] object
    statistics: dict[str, np.ndarray]  # name -> [layers, heads]
    divergence: np.ndarray  # [layers * heads, layers * heads] nats
    mds: np.ndarray  # [layers * heads, 2]
    examples: HeadExamples | None
    related: Related = field(default_factory=Related)

    @property
    def layers(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.labels.shape[1])

    def check_head(self, layer: int, head: int) -> None:
        if layer >= self.layers or head >= self.num_heads:
            raise RequestError(
                422,
                f"Head ({layer}, {head}) does not exist; the analysis has {self.layers} layers x "
                f"{self.num_heads} heads.",
            )

    def overview(self) -> dict[str, Any]:
        """The map and the grid: every head's statistics, label and place."""
        ablation = self.related.ablation
        return {
            "path": self.path,
            "summary": {
                key: value for key, value in self.summary.items() if isinstance(value, str | int | float)
            },
            "layers": self.layers,
            "heads": self.num_heads,
            "labels": self.labels.tolist(),
            "label_descriptions": LABEL_DESCRIPTIONS,
            "label_colours": {
                label: PATTERN_COLOURS.get(label, OTHER_PATTERN_COLOUR) for label in np.unique(self.labels)
            },
            "statistics": {name: _grid(values) for name, values in self.statistics.items()},
            "map": [[float(x), float(y)] for x, y in self.mds],
            "examples_per_head": 0 if self.examples is None else self.examples.per_head,
            "related": {
                "dependency": None if self.related.dependency is None else self.related.dependency[0],
                "coreference": None if self.related.coreference is None else self.related.coreference[0],
                "ablation": None if ablation is None else ablation.path,
                "ablation_model": None if ablation is None else ablation.model,
                "ablation_same_model": ablation is not None and ablation.model == self.summary.get("model"),
                "patching": None if self.related.patching is None else self.related.patching.path,
                "circuit": None if self.related.circuit is None else self.related.circuit.path,
            },
        }

    def nearest(self, layer: int, head: int, count: int = NEAREST) -> list[dict[str, Any]]:
        """The ``count`` heads with the smallest mean JS divergence from ``(layer, head)``."""
        index = layer * self.num_heads + head
        row = self.divergence[index]
        order = [other for other in np.argsort(row, kind="stable") if other != index][:count]
        return [
            {
                "layer": int(other // self.num_heads),
                "head": int(other % self.num_heads),
                "label": str(self.labels.flat[other]),
                "divergence": _finite(row[other]),
            }
            for other in order
        ]

    def head_detail(self, layer: int, head: int) -> dict[str, Any]:
        """Everything the explorer shows of one head (its examples' views: :meth:`example_page`)."""
        self.check_head(layer, head)
        examples = [] if self.examples is None else self.examples.head(layer, head)
        return {
            "layer": layer,
            "head": head,
            "label": str(self.labels[layer, head]),
            "statistics": {name: _finite(values[layer, head]) for name, values in self.statistics.items()},
            "nearest": self.nearest(layer, head),
            "example_pattern": None if self.examples is None else str(self.examples.patterns[layer, head]),
            "examples": [
                {
                    "rank": example.rank,
                    "segment": example.segment,
                    "score": _finite(example.score),
                    "origin": example.tokens.origin,
                    "tokens": len(example.tokens.tokens),
                }
                for example in examples
            ],
            "relations": self._relations(layer, head),
            "coreference": self._coreference(layer, head),
            "ablation": self._ablation(layer, head),
            "patching": self._patching(layer, head),
            "circuit": self._circuit(layer, head),
        }

    def _relations(self, layer: int, head: int) -> list[dict[str, Any]]:
        """The dependency relations this head tracks best (its better direction each), ranked by its gain
        over the relation's fixed-offset baseline (``gain = accuracy - baseline_accuracy``; a head no better
        than the baseline does not track the relation; relations without a baseline last), with the
        relation's best head."""
        if self.related.dependency is None:
            return []
        _, accuracies, table = self.related.dependency
        mine = accuracies[(accuracies["layer"] == layer) & (accuracies["head"] == head)]
        best = mine.sort_values("accuracy", ascending=False, kind="stable").drop_duplicates("relation")
        rows = []
        for row in best.itertuples(index=False):
            reference = table[table["relation"] == row.relation]
            first = reference.iloc[0] if len(reference) else None
            accuracy = _finite(row.accuracy)
            baseline = None if first is None else _finite(first["baseline_accuracy"])
            rows.append(
                {
                    "relation": str(row.relation),
                    "direction": int(row.direction),
                    "accuracy": accuracy,
                    "baseline_accuracy": baseline,
                    "gain": None if accuracy is None or baseline is None else accuracy - baseline,
                    "count": int(row.count),
                    "best_head": None if first is None else str(first["best_head"]),
                    "best_accuracy": None if first is None else _finite(first["accuracy"]),
                }
            )
        rows.sort(key=lambda entry: (entry["gain"] is None, -(entry["gain"] or 0.0)))
        return rows[:RELATIONS]

    def _coreference(self, layer: int, head: int) -> list[dict[str, Any]]:
        """This head's antecedent-selection accuracy per mention type, and its rank among the heads."""
        if self.related.coreference is None:
            return []
        _, accuracies = self.related.coreference
        rows = []
        for kind, group in accuracies.groupby("type", sort=False):
            mine = group[(group["layer"] == layer) & (group["head"] == head)]
            if mine.empty:
                continue
            accuracy = float(mine["accuracy"].iloc[0])
            rank = int((group["accuracy"] > accuracy).sum()) + 1
            rows.append(
                {
                    "type": str(kind),
                    "accuracy": _finite(accuracy),
                    "rank": rank,
                    "count": int(mine["count"].iloc[0]),
                }
            )
        return rows

    def _ablation(self, layer: int, head: int) -> dict[str, Any] | None:
        """The accuracy change of removing this head, and its rank (1: hurts most; ``None`` when every
        head's change is the same, as for a classifier that answers the same whatever is removed)."""
        ablation = self.related.ablation
        if ablation is None:
            return None
        change = ablation.change
        finite = change[np.isfinite(change)]
        ranked = finite.size > 0 and finite.min() < finite.max()
        return {
            "change": _finite(change[layer, head]),
            "accuracy": _finite(ablation.accuracy[layer, head]),
            "importance": None if ablation.importance is None else _finite(ablation.importance[layer, head]),
            "rank": int((change < change[layer, head]).sum()) + 1 if ranked else None,
        }

    def _patching(self, layer: int, head: int) -> dict[str, Any] | None:
        """This head's patching effect, the run's direction, method and ablation, and its rank by the
        effect's size whatever its sign (1: largest; under noising the heads that matter are the most
        negative)."""
        patching = self.related.patching
        if patching is None:
            return None
        effect = patching.effect
        size = np.abs(effect)
        return {
            "effect": _finite(effect[layer, head]),
            "rank": int((size > size[layer, head]).sum()) + 1,
            "direction": patching.direction,
            "method": patching.method,
            "ablation": patching.ablation,
        }

    def _circuit(self, layer: int, head: int) -> dict[str, Any] | None:
        """This head's strongest edges in and out of the circuit run's ranking, and its method."""
        circuit = self.related.circuit
        if circuit is None:
            return None
        return {
            "method": circuit.method,
            "edges": len(circuit.edges),
            **head_edges(circuit.edges, layer, head),
        }

    def example_page(self, layer: int, head: int, rank: int, theme: str) -> str:
        """The head view of ``(layer, head)`` on its example ``rank``, drawn from the stored 8-bit codes."""
        self.check_head(layer, head)
        if self.examples is None:
            raise RequestError(
                404, f"The analysis '{shown(self.path)}' has no stored examples ({EXAMPLES_FILE})."
            )
        examples = {example.rank: example for example in self.examples.head(layer, head)}
        if rank not in examples:
            raise RequestError(404, f"Head ({layer}, {head}) has no example {rank}; it has {len(examples)}.")
        example = examples[rank]
        tokens = example.tokens
        attention = Attention(
            **tokens.roles(),
            probs=example.probs[None, None],
            queries=None,
            keys=None,
            scaling=np.full(1, np.nan),
            truncated=0,
            model_name=self.examples.model,
            weights="norm" if self.examples.weights == "norm" else "attention",
        )
        data = view_data(attention, "head", theme="dark" if theme == "dark" else "light")
        return View("head", {**data, "layerNames": [str(layer)], "headNames": [str(head)]}).html


#: The files whose size and modification time tell whether an analysis changed.
STAMP_FILES = (HEADS_FILE, JS_DIVERGENCE_FILE, SUMMARY_FILE, EXAMPLES_FILE)


def _stamp(analysis: OpenFolder) -> tuple[tuple[int, int], ...]:
    stamps = []
    for name in STAMP_FILES:
        info = analysis.stat(name)
        stamps.append((-1, -1) if info is None else (info.st_size, info.st_mtime_ns))
    return tuple(stamps)


def _related_folders(folder: RunsFolder, analysis: OpenFolder) -> Iterator[OpenFolder]:
    """The analysis folder, then the folders below its parent (up to :data:`RELATED_DEPTH` levels)."""
    yield analysis
    parts = path_parts(analysis.label)
    if not parts:
        return
    try:
        base = folder.folder("/".join(parts[:-1]))
    except RequestError:
        return  # the parent was swapped for a link or removed
    with base:
        yield from (here for here in base.folders(RELATED_DEPTH) if here.label != analysis.label)


def _ablation_model(here: OpenFolder) -> str | None:
    """The model an ablation folder's ``summary.json`` names, ``None`` when it names none."""
    if not here.is_file(SUMMARY_FILE):
        return None
    summary = json.loads(here.read_bytes(SUMMARY_FILE).decode("utf-8"))
    model = summary.get("model") if isinstance(summary, dict) else None
    return model if isinstance(model, str) else None


def _patching(here: OpenFolder, layers: int, heads: int, model: object) -> Patching | None:
    """A patching folder's head effects when its ``summary.json`` names ``model`` and they fit the grid."""
    summary = json.loads(here.read_bytes(SUMMARY_FILE).decode("utf-8"))
    if not isinstance(summary, dict) or summary.get("model") != model:
        return None
    grid = GRIDS.get(str(summary.get("granularity")))
    if grid is None or grid.axes != ("layer", "head"):
        return None
    effect = _head_grid(_read_csv(here, "head_effects.csv"), "effect", layers, heads)
    if effect is None:
        return None
    methods = summary.get("methods") or ["exact"]
    ablation = str(summary.get("ablation", "counterfactual"))
    return Patching(here.label, effect, str(summary.get("direction")), str(methods[0]), ablation)


def _circuit(here: OpenFolder, layers: int, heads: int, model: object) -> Circuit | None:
    """A circuit folder's edges when its ``summary.json`` names ``model`` (or it is the analysis's own
    folder, whose summary is the analysis's) and its heads fit the ``layers x heads`` grid."""
    summary = json.loads(here.read_bytes(SUMMARY_FILE).decode("utf-8"))
    if not isinstance(summary, dict) or summary.get("model") != model:
        return None
    with here.file(EDGES_FILE) as handle:
        edges = read_edges(handle, f"{here.label}/{EDGES_FILE}")
    spanned = graph_shape(edges)
    if spanned[0] > layers or spanned[1] > heads:
        return None
    return Circuit(here.label, str(summary.get("method", "")), edges)


def _find_related(
    folder: RunsFolder, analysis: OpenFolder, layers: int, heads: int, model: object
) -> Related:
    """The first dependency probe, coreference probe, ablation, patching run and circuit run next to
    ``analysis`` whose heads are a
    ``layers x heads`` grid (module docstring); an ablation of ``model`` (the analysis's) before one of
    another model."""
    related = Related()
    for here in _related_folders(folder, analysis):
        try:
            if here.is_file("accuracies.csv"):
                frame = _read_csv(here, "accuracies.csv")
                fits = {"layer", "head", "accuracy", "count"} <= set(frame.columns) and len(frame) > 0
                fits = (
                    fits and int(frame["layer"].max()) + 1 == layers and int(frame["head"].max()) + 1 == heads
                )
                dependency = fits and related.dependency is None and "relation" in frame.columns
                if dependency and here.is_file("table.csv"):
                    related.dependency = (here.label, frame, _read_csv(here, "table.csv"))
                elif fits and related.coreference is None and "type" in frame.columns:
                    related.coreference = (here.label, frame)
            found = related.ablation
            if here.is_file("ablation.csv") and (found is None or found.model != model):
                frame = _read_csv(here, "ablation.csv")
                change = _head_grid(frame, "change", layers, heads)
                accuracy = _head_grid(frame, "accuracy", layers, heads)
                importance = None
                if here.is_file("importance.csv"):
                    importance = _head_grid(_read_csv(here, "importance.csv"), "importance", layers, heads)
                ablation_model = _ablation_model(here)
                if change is not None and accuracy is not None and (found is None or ablation_model == model):
                    related.ablation = Ablation(here.label, ablation_model, change, accuracy, importance)
            if related.patching is None and here.is_file("head_effects.csv") and here.is_file(SUMMARY_FILE):
                related.patching = _patching(here, layers, heads, model)
            if related.circuit is None and here.is_file(EDGES_FILE) and here.is_file(SUMMARY_FILE):
                related.circuit = _circuit(here, layers, heads, model)
        except (BertologyError, KeyError, ValueError, TypeError, UnicodeDecodeError):
            continue  # a damaged or foreign file (or a link) beside the analysis is left out, not an error
    return related


def _damaged(analysis: OpenFolder, name: str, what: str) -> BertologyError:
    """The one sentence for the file ``name`` of ``analysis`` that cannot be used, saying ``what`` is
    wrong."""
    return BertologyError(f"The analysis '{analysis.label}' has a damaged {name}: {what}.")


def _read_csv(analysis: OpenFolder, name: str) -> pd.DataFrame:
    """The CSV file ``name`` of ``analysis`` (or of a folder beside it).

    Raises:
        BertologyError: it cannot be read or parsed (named); LinkRefused: it is a symbolic link.
    """
    try:
        with analysis.file(name) as handle:
            return pd.read_csv(handle)
    except UnicodeDecodeError as error:
        raise _damaged(analysis, name, f"it is not UTF-8 text (byte {error.start})") from None
    except (OSError, ValueError) as error:
        raise _damaged(analysis, name, f"it cannot be read as CSV ({error})") from None


def _read_summary(analysis: OpenFolder) -> dict[str, Any]:
    """The analysis's ``summary.json``, a JSON object.

    Raises:
        BertologyError: it is not UTF-8 text, not JSON, or not an object (each named).
    """
    try:
        text = analysis.read_bytes(SUMMARY_FILE).decode("utf-8")
        summary = json.loads(text)
    except UnicodeDecodeError as error:
        raise _damaged(analysis, SUMMARY_FILE, f"it is not UTF-8 text (byte {error.start})") from None
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno}"
        raise _damaged(analysis, SUMMARY_FILE, f"it is not JSON ({error.msg} at {where})") from None
    except RecursionError:
        raise _damaged(analysis, SUMMARY_FILE, "its JSON is nested too deeply to read") from None
    except OSError as error:
        raise _damaged(analysis, SUMMARY_FILE, f"it cannot be read ({error.strerror or error})") from None
    if not isinstance(summary, dict):
        raise _damaged(analysis, SUMMARY_FILE, f"it holds a JSON {type(summary).__name__}, not an object")
    return summary


def _head_grid_of(analysis: OpenFolder, heads: pd.DataFrame, divergence: pd.DataFrame) -> tuple[int, int]:
    """``(layers, heads)`` of the analysis, from its ``heads.csv`` (one row per head of the whole grid, with
    integer ``layer`` and ``head`` from 0) checked against its ``head_js_divergence.csv`` (a ``layer-head``
    column and one row and column of distances per head).

    Raises:
        BertologyError: which file does not hold what, and how (e.g. a ``heads.csv`` cut short).
    """
    missing = [name for name in ("layer", "head", "label") if name not in heads.columns]
    if missing:
        raise _damaged(analysis, HEADS_FILE, f"it has no {' or '.join(missing)} column")
    keys = heads[["layer", "head"]]
    if len(heads) == 0 or not all(pd.api.types.is_integer_dtype(kind) for kind in keys.dtypes):
        raise _damaged(analysis, HEADS_FILE, "its layer and head columns are not whole numbers on every row")
    if int(keys.min().min()) < 0 or keys.duplicated().any():
        raise _damaged(analysis, HEADS_FILE, "it lists a head twice or a negative layer or head")
    layers, count = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    if "layer-head" not in divergence.columns:
        raise _damaged(analysis, JS_DIVERGENCE_FILE, "it has no layer-head column")
    rows, columns = len(divergence), len(divergence.columns) - 1
    if rows != columns:
        shape = f"{rows} rows of {columns} distances"
        raise _damaged(analysis, JS_DIVERGENCE_FILE, f"it holds {shape}, not one row and column per head")
    if len(heads) != layers * count or len(heads) != rows:
        what = (
            f"it lists {len(heads)} heads, where its layers and heads span {layers} x {count} = "
            f"{layers * count} and {JS_DIVERGENCE_FILE} has {rows} (is it cut short?)"
        )
        raise _damaged(analysis, HEADS_FILE, what)
    return layers, count


def read_analysis(folder: RunsFolder, analysis: OpenFolder) -> AnalysisRun:
    """Read the opened analysis folder ``analysis`` (named by its path in the runs folder).

    Raises:
        RequestError: 404 for a folder that is no analysis.
        LinkRefused: a file it reads is a symbolic link (403).
        BertologyError: a damaged file (named).
    """
    path = analysis.label
    needed = (HEADS_FILE, JS_DIVERGENCE_FILE, SUMMARY_FILE)
    if not all(analysis.stat(name) is not None for name in needed):
        missing = f"no {', '.join(needed[:2])} or {needed[2]}"
        raise RequestError(404, f"'{shown(path)}' is not an analysis folder ({missing}).")
    summary = _read_summary(analysis)
    heads = _read_csv(analysis, HEADS_FILE)
    divergence = _read_csv(analysis, JS_DIVERGENCE_FILE)
    layers, count = _head_grid_of(analysis, heads, divergence)
    labels = np.full((layers, count), "none", dtype=object)
    labels[heads["layer"].to_numpy(), heads["head"].to_numpy()] = heads["label"].astype(str).to_numpy()
    statistics = {
        name: grid
        for name in heads.columns
        if name not in _NOT_STATISTICS and (grid := _head_grid(heads, name, layers, count)) is not None
    }
    if not statistics:
        raise _damaged(analysis, HEADS_FILE, "it has no column of numbers per head (no statistic)")
    try:
        distances = divergence.set_index("layer-head").to_numpy(dtype=np.float64)
    except (ValueError, TypeError):
        raise _damaged(analysis, JS_DIVERGENCE_FILE, "a distance in it is not a number") from None
    seed = summary.get("seed", 0)
    examples = None
    if analysis.stat(EXAMPLES_FILE) is not None:
        try:
            handle = analysis.file(EXAMPLES_FILE)
        except OSError as error:
            reason = f"it cannot be read ({error.strerror or error})"
            raise _damaged(analysis, EXAMPLES_FILE, reason) from None
        with handle:
            examples = HeadExamples.load(handle)
    if examples is not None and examples.segments.shape[:2] != (layers, count):
        raise BertologyError(f"The analysis '{path}' has a {EXAMPLES_FILE} of another layer x head grid.")
    return AnalysisRun(
        path=path,
        summary=summary,
        heads=heads,
        labels=labels,
        statistics=statistics,
        divergence=distances,
        mds=mds_embedding(distances, seed=int(seed) if isinstance(seed, int) else 0),
        examples=examples,
        related=_find_related(folder, analysis, layers, count, summary.get("model")),
    )


class AnalysisRuns:
    """The analysis folders of a runs folder, read on demand and kept while their files are unchanged."""

    def __init__(
        self, folder: RunsFolder, reader: Callable[[RunsFolder, OpenFolder], AnalysisRun] = read_analysis
    ):
        self.folder = folder
        self.reader = reader
        self._runs: dict[str, tuple[tuple[tuple[int, int], ...], AnalysisRun]] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> AnalysisRun:
        """The analysis at ``path`` (relative to the runs folder). Runs in a worker thread (it reads files).

        Raises:
            RequestError: 403 / 404 for paths (:meth:`RunsFolder.open`) and non-analysis folders.
            LinkRefused: a file it reads is a symbolic link (403).
            BertologyError: a damaged analysis file.
        """
        opened = self.folder.open(path)
        if not isinstance(opened, OpenFolder):
            opened.close()
            raise RequestError(404, f"'{shown(path)}' is not an analysis folder.")
        with opened as analysis:  # the stamp and the files are read from the same opened folder
            stamp = _stamp(analysis)
            with self._lock:
                cached = self._runs.get(analysis.label)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            run = self.reader(self.folder, analysis)
        with self._lock:
            self._runs[analysis.label] = (stamp, run)
            while len(self._runs) > CACHE_RUNS:
                self._runs.pop(next(iter(self._runs)))
        return run
