"""Figures of per-head results, drawn with matplotlib's object API on an Agg canvas (no pyplot state).

Every function returns a :class:`~matplotlib.figure.Figure` sized for the model's shape (``layers x
heads``, from 3 x 4 to 24 x 16 and beyond); :func:`to_png` renders one. Heads are 0-based ``(layer,
head)`` on every axis and label. Values are drawn with viridis (perceptually uniform); NaN cells of a
heatmap (a statistic no segment defined for that head) are grey and hatched. Pattern labels have fixed
tab10 colours and markers, the same in every figure and report.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from bertology.analysis.patterns import LABEL_DESCRIPTIONS, OTHER_PATTERN_COLOUR, PATTERN_COLOURS
from bertology.stats.base import HeadTable

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: Grey for undefined (NaN) values, neither end of the colormap.
NAN_COLOUR = "#c4c4c4"

#: Perceptually uniform; NaN cells are left transparent over a grey hatched background.
COLORMAP = matplotlib.colormaps["viridis"].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
#: For signed values centred on 0 (differences, accuracy changes): blue below, red above.
DIVERGING_COLORMAP = matplotlib.colormaps["RdBu_r"].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))

#: Short names of statistics for titles and legends; any other name is shown with spaces for "_".
TITLES = {
    "previous": "previous token",
    "next": "next token",
    "current": "current token",
    "cls": "to [CLS]",
    "sep": "to [SEP]",
    "punct": 'to "." or ","',
    "sink": "to first token (sink)",
    "sep_to_sep": "[SEP] → [SEP]",
    "other_to_sep": "other → [SEP]",
    "entropy": "attention entropy",
    "entropy_uniform": "uniform attention entropy",
    "cls_entropy": "[CLS] attention entropy",
    "cls_entropy_uniform": "uniform [CLS] attention entropy",
    "confidence": "largest weight",
    "voita_confidence": "Voita's confidence (no [SEP])",
    "confidence_without_delimiters": "largest weight, no [CLS] / [SEP]",
}

#: Markers used in order for lines and labels, so figures also read in greyscale.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d")

_TICK_SIZE = 8

#: Inches a figure may be wide and still be shown at its own size in a report (the content column of
#: ``report.css``, 84rem less 4rem of 15 px, at the 110 dpi of :func:`to_png`): wider ones are shrunk
#: and their tick labels become too small to read.
PAGE_WIDTH = 10.9
_LABEL_SIZE = 9
_TITLE_SIZE = 10


def title_of(name: str) -> str:
    """The short display name of statistic ``name`` (:data:`TITLES`)."""
    return TITLES.get(name, name.replace("_", " "))


def unit_of(name: str) -> str:
    """Axis / colour bar label for statistic ``name``: entropies are in nats, the rest attention weights."""
    return "nats" if "entropy" in name else "attention weight"


#: Pattern labels in marker order; "none" is a grey dot.
_LABEL_ORDER = tuple(name for name in LABEL_DESCRIPTIONS if name != "none")


def label_style(label: str) -> tuple[str, str]:
    """(colour, marker) of a label: its :data:`~bertology.analysis.patterns.PATTERN_COLOURS` colour (the
    explorer's too) and a marker in :data:`~bertology.analysis.patterns.LABEL_DESCRIPTIONS` order, a grey
    dot for ``"none"``; labels not listed there share the next colour and marker."""
    if label == "none":
        return PATTERN_COLOURS["none"], "."
    index = _LABEL_ORDER.index(label) if label in _LABEL_ORDER else len(_LABEL_ORDER)
    return PATTERN_COLOURS.get(label, OTHER_PATTERN_COLOUR), MARKERS[index]


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout Figure of ``width x height`` inches on its own Agg canvas."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def to_png(figure: Figure, *, dpi: int = 110) -> bytes:
    """The figure as PNG bytes on a white background."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return buffer.getvalue()


def index_ticks(count: int, most: int = 12) -> np.ndarray:
    """0-based tick positions for ``count`` layers or heads: every one, or every k-th for at most ``most``."""
    return np.arange(0, count, max(1, math.ceil(count / most)))


def layer_means(values: np.ndarray) -> np.ndarray:
    """[layers] mean over heads of ``values [layers, heads]``, ignoring NaN; NaN where a layer has none."""
    defined = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(defined, values, 0.0).sum(1) / defined.sum(1)


def value_range_of(*grids: np.ndarray, symmetric: bool = False) -> tuple[float, float]:
    """One colour range covering every finite value of ``grids``: from 0 (or the minimum, if negative) to
    the largest value, or, ``symmetric``, from ``-m`` to ``m`` with ``m`` the largest size."""
    finite = np.concatenate([np.ravel(grid)[np.isfinite(np.ravel(grid))] for grid in grids] or [np.empty(0)])
    if finite.size == 0:
        return (-1.0, 1.0) if symmetric else (0.0, 1.0)
    if symmetric:
        top = max(float(np.abs(finite).max()), 1e-6)
        return -top, top
    low = min(0.0, float(finite.min()))
    return low, max(float(finite.max()), low + 1e-6)


def _heatmap_panel_size(layers: int, heads: int) -> tuple[float, float]:
    """(width, height) in inches of one heatmap with its colour bar: square cells of at most 0.32 in."""
    cell = min(0.32, max(0.12, 3.2 / max(layers, heads)))
    return max(2.6, heads * cell + 1.5), max(1.9, layers * cell + 0.9)


def _head_axes(ax: Axes, layers: int, heads: int) -> None:
    """0-based layer (rows, top to bottom) and head (columns) ticks and axis labels."""
    ax.set_xticks(index_ticks(heads))
    ax.set_yticks(index_ticks(layers))
    ax.tick_params(labelsize=_TICK_SIZE, length=2)
    ax.set_xlabel("head", fontsize=_LABEL_SIZE)
    ax.set_ylabel("layer", fontsize=_LABEL_SIZE)


def _heatmap(
    ax: Axes,
    values: np.ndarray,
    *,
    title: str,
    unit: str,
    value_range: tuple[float, float],
    cmap: Colormap = COLORMAP,
) -> None:
    """One layer x head heatmap with a labelled colour bar; NaN cells show the grey hatched background."""
    layers, heads = values.shape
    ax.add_patch(
        Rectangle(
            (-0.5, -0.5), heads, layers, facecolor=NAN_COLOUR, edgecolor="white", hatch="///", lw=0, zorder=-1
        )
    )
    image = ax.imshow(
        values,
        cmap=cmap,
        vmin=value_range[0],
        vmax=value_range[1],
        interpolation="nearest",
        aspect="auto",
    )
    bar = ax.get_figure().colorbar(image, ax=ax, fraction=0.08, pad=0.03)
    bar.set_label(unit, fontsize=_TICK_SIZE)
    bar.ax.tick_params(labelsize=_TICK_SIZE)
    ax.set_title(title, fontsize=_TITLE_SIZE)
    _head_axes(ax, layers, heads)
    if not np.isfinite(values).any():
        ax.text(
            (heads - 1) / 2, (layers - 1) / 2, "undefined", ha="center", va="center", fontsize=_LABEL_SIZE
        )


def heatmaps(
    table: HeadTable,
    names: Sequence[str],
    *,
    value_range: tuple[float, float] | None = None,
    columns: int = 3,
    unit: str | None = None,
    cmap: Colormap = COLORMAP,
) -> Figure:
    """Layer x head heatmaps of ``table``'s statistics ``names``, ``columns`` to a row, or fewer where
    that many would be wider than :data:`PAGE_WIDTH`.

    value_range: one colour range for every panel; default: each panel from 0 to its largest value.
    unit: the colour bars' label for every panel; default: :func:`unit_of` each statistic.
    cmap: the colour map (:data:`DIVERGING_COLORMAP` for signed values around 0).
    """
    panel_width, panel_height = _heatmap_panel_size(table.num_layers, table.num_heads)
    across = max(1, min(columns, len(names), math.floor(PAGE_WIDTH / panel_width)))
    down = math.ceil(len(names) / across)
    figure = new_figure(panel_width * across, panel_height * down)
    axes = figure.subplots(down, across, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        values = table[name]
        _heatmap(
            ax,
            values,
            title=title_of(name),
            unit=unit or unit_of(name),
            value_range=value_range or value_range_of(values),
            cmap=cmap,
        )
    for ax in axes[len(names) :]:
        ax.remove()
    return figure


def heatmap_png(outdir: Path, name: str, grids: dict[str, np.ndarray], dpi: int, **options: object) -> bytes:
    """Layer x head heatmaps of ``grids`` (each ``[layers, heads]``) as PNG bytes, also saved as
    ``outdir/plots/<name>.png``; ``options`` go to :func:`heatmaps`."""
    table = HeadTable(columns=grids, defined_segments={}, segments=0)
    png = to_png(heatmaps(table, list(grids), **options), dpi=dpi)  # type: ignore[arg-type]
    (outdir / "plots").mkdir(parents=True, exist_ok=True)
    (outdir / "plots" / f"{name}.png").write_bytes(png)
    return png


def _layer_panels(count: int, layers: int) -> tuple[Figure, np.ndarray]:
    """A figure with ``count`` side-by-side per-layer panels, wider for more layers."""
    width = min(7.0, max(3.8, 1.8 + 0.3 * layers))
    figure = new_figure(width * count, 3.4)
    return figure, figure.subplots(1, count, squeeze=False)[0]


def _layer_axes(ax: Axes, layers: int, *, title: str, ylabel: str) -> None:
    ax.set_xticks(index_ticks(layers, most=24))
    ax.set_xlim(-0.6, layers - 0.4)
    ax.tick_params(labelsize=_TICK_SIZE)
    ax.set_xlabel("layer", fontsize=_LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=_LABEL_SIZE)
    ax.set_title(title, fontsize=_TITLE_SIZE)
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=_TICK_SIZE, frameon=False)


def _layer_points(
    ax: Axes, values: np.ndarray, *, label: str, colour: str, marker: str, offset: float = 0.0
) -> None:
    """Each head's value as a faint point over its layer (shifted by ``offset``) and the mean per layer
    as a line labelled ``label``."""
    layers, heads = values.shape
    x = np.arange(layers)
    ax.scatter(
        np.repeat(x + offset, heads), values.ravel(), s=9, alpha=0.3, color=colour, marker=marker, lw=0
    )
    ax.plot(x, layer_means(values), color=colour, marker=marker, ms=4, lw=1.6, label=label)


def layer_summary(table: HeadTable, panels: Mapping[str, Sequence[str]]) -> Figure:
    """Per-layer attention, one panel per ``title -> statistics`` item (Clark et al. 2019, Figs. 2-3):
    for each statistic the mean over a layer's heads (line) and each head's value (faint points). Each
    panel's value axis runs from 0 to a little above its largest value, so values near 0.02 are not
    flat lines on a 0-1 axis."""
    figure, axes = _layer_panels(len(panels), table.num_layers)
    for ax, (title, names) in zip(axes, panels.items(), strict=True):
        for index, name in enumerate(names):
            _layer_points(
                ax,
                table[name],
                label=title_of(name),
                colour=f"C{index}",
                marker=MARKERS[index],
                offset=0.12 * (index - (len(names) - 1) / 2),
            )
        values = np.concatenate([np.ravel(table[name]) for name in names])
        finite = values[np.isfinite(values)]
        top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        ax.set_ylim(-0.03 * top, 1.05 * top)
        _layer_axes(ax, table.num_layers, title=title, ylabel="mean attention weight")
    return figure


def entropy_by_layer(table: HeadTable, panels: Sequence[tuple[str, str]]) -> Figure:
    """Per-layer entropy, one panel per ``(statistic, uniform baseline)`` pair (Clark et al. 2019, Fig. 4):
    each head's value (faint points), the mean over heads (line) and the baseline's mean (dashed)."""
    figure, axes = _layer_panels(len(panels), table.num_layers)
    for ax, (name, baseline) in zip(axes, panels, strict=True):
        _layer_points(ax, table[name], label="mean over heads", colour="C0", marker="o")
        ax.plot(layer_means(table[baseline]), color="0.35", ls="--", lw=1.2, label="uniform attention")
        ax.set_ylim(bottom=0)
        _layer_axes(ax, table.num_layers, title=title_of(name), ylabel=unit_of(name))
    return figure


def _annotation_size(count: int) -> float:
    """Font size of the point annotations of a head map with ``count`` heads."""
    return 7.0 if count <= 48 else 6.0 if count <= 200 else 5.5


#: Where a point's label may go, tried in this order: (x, y) offset in points, horizontal and vertical
#: alignment of the text.
_LABEL_SPOTS = (
    (3, 2, "left", "bottom"),
    (3, -2, "left", "top"),
    (-3, 2, "right", "bottom"),
    (-3, -2, "right", "top"),
    (0, 4, "center", "bottom"),
    (0, -4, "center", "top"),
    (5, 0, "left", "center"),
    (-5, 0, "right", "center"),
)

#: Half the side, in points, of the square kept free around every marker.
_MARKER_RADIUS = 3.5


def place_labels(
    ax: Axes, coordinates: np.ndarray, texts: Sequence[str], order: Sequence[int], size: float
) -> list[int]:
    """Label points without overlap: each point in ``order`` gets ``texts[i]`` at the first of
    :data:`_LABEL_SPOTS` where it overlaps no label placed before it, no marker and nothing outside the
    axes; a point with no such spot stays unlabelled. Returns the points labelled, in ``order``.

    coordinates: [points, 2] in data units. Call it once the axes' limits are final (after everything
    else is drawn); labels are left out of the figure's layout so placing them moves nothing.
    """
    figure = ax.get_figure()
    assert figure is not None
    figure.draw_without_rendering()  # apply the layout, so data map to their final pixels
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    points = ax.transData.transform(coordinates)  # [points, 2] pixels
    radius = _MARKER_RADIUS * figure.dpi / 72
    frame = ax.get_window_extent(renderer)
    taken: list[tuple[float, float, float, float]] = []
    labelled: list[int] = []
    for index in order:
        for dx, dy, horizontal, vertical in _LABEL_SPOTS:
            label = ax.annotate(
                texts[index],
                coordinates[index],
                xytext=(dx, dy),
                textcoords="offset points",
                ha=horizontal,
                va=vertical,
                fontsize=size,
                alpha=0.85,
            )
            label.set_in_layout(False)
            box = label.get_window_extent(renderer)
            x0, y0, x1, y1 = box.x0, box.y0, box.x1, box.y1
            covers = (
                (points[:, 0] > x0 - radius)
                & (points[:, 0] < x1 + radius)
                & (points[:, 1] > y0 - radius)
                & (points[:, 1] < y1 + radius)
            )
            covers[index] = False
            clashes = covers.any() or any(
                x0 < right and left < x1 and y0 < top and bottom < y1 for left, bottom, right, top in taken
            )
            inside = frame.x0 <= x0 and x1 <= frame.x1 and frame.y0 <= y0 and y1 <= frame.y1
            if inside and not clashes:
                taken.append((x0, y0, x1, y1))
                labelled.append(index)
                break
            label.remove()
    return labelled


def head_map(coordinates: np.ndarray, labels: np.ndarray) -> Figure:
    """A 2-D map of the heads (e.g. MDS of their distances, Clark et al. 2019, Fig. 6), coloured by
    primary label, points annotated ``layer-head`` (0-based) where the name overlaps nothing
    (:func:`place_labels`; labelled heads first).

    coordinates: [layers * heads, 2], layer-major. labels: [layers, heads] pattern names.
    """
    heads = labels.shape[1]
    flat = labels.ravel()
    side = 6.0 if flat.size <= 150 else 8.5
    figure = new_figure(side + 3.2, side)
    ax = figure.subplots()
    present = [label for label in LABEL_DESCRIPTIONS if label in set(flat)]
    present += sorted(set(flat) - set(present))
    for label in present:
        chosen = flat == label
        colour, marker = label_style(label)
        description = LABEL_DESCRIPTIONS.get(label, label).removeprefix(f"{label}: ")
        ax.scatter(
            *coordinates[chosen].T,
            color=colour,
            marker=marker,
            s=40 if marker != "." else 70,
            label=f"{label} ({chosen.sum()}): {description}",
            edgecolors="white",
            linewidths=0.4,
        )
    ax.set_aspect("equal", adjustable="datalim")
    ax.tick_params(labelsize=_TICK_SIZE)
    ax.set_xlabel("MDS 1", fontsize=_LABEL_SIZE)
    ax.set_ylabel("MDS 2", fontsize=_LABEL_SIZE)
    ax.grid(alpha=0.3, lw=0.5)
    figure.legend(
        loc="outside right upper", fontsize=_TICK_SIZE, title="primary label (heads)", frameon=False
    )
    names = [f"{layer}-{head}" for layer, head in (divmod(index, heads) for index in range(flat.size))]
    labelled_first = np.argsort(flat == "none", kind="stable")  # heads with a label, then the rest
    shown = place_labels(ax, coordinates, names, labelled_first.tolist(), _annotation_size(flat.size))
    ax.set_title(
        f"{len(shown)} of {flat.size} heads named (the others' names would overlap)", fontsize=_LABEL_SIZE
    )
    return figure
