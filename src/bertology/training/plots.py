"""Figures of a training run: loss and accuracy, per-head statistics over steps, and what changed.

Built with :mod:`bertology.report.plots` (matplotlib object API, Agg canvas). Heads keep the colours of
the head view (a tab20 palette, dark hues first), so a head's curve and its lines in the view match.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from bertology.report.plots import heatmaps, index_ticks, new_figure, title_of, unit_of
from bertology.stats.base import HeadTable

#: The head view's palette: tab20's dark hues, then its light ones.
HEAD_COLOURS = tuple(matplotlib.colormaps["tab20"].colors[0::2] + matplotlib.colormaps["tab20"].colors[1::2])

#: Colour of the training rules' alerts on the figures.
ALERT_COLOUR = "#d62728"
_TICK_SIZE = 8
_LABEL_SIZE = 9
_TITLE_SIZE = 10


def training_curves(metrics: pd.DataFrame, alerts: Sequence[tuple[int, str]] = ()) -> Figure:
    """Loss (training rows and dev evaluations) and dev accuracy against the optimizer step.

    metrics: the rows of ``metrics.jsonl`` (columns ``step``, ``split``, ``loss``, ``accuracy``).
    alerts: (step, rule name) of the training rules' alerts, drawn as labelled dashed lines.
    """
    figure = new_figure(9.0, 3.2)
    loss_ax, accuracy_ax = figure.subplots(1, 2)
    train = metrics[metrics["split"] == "train"]
    dev = metrics[metrics["split"] == "dev"]
    loss_ax.plot(train["step"], train["loss"], color="C0", lw=1.2, label="training (running mean)")
    loss_ax.plot(dev["step"], dev["loss"], color="C1", marker="o", ms=4, lw=1.2, label="dev")
    loss_ax.set_ylabel("cross-entropy (nats)", fontsize=_LABEL_SIZE)
    loss_ax.set_title("loss", fontsize=_TITLE_SIZE)
    loss_ax.legend(fontsize=_TICK_SIZE, frameon=False)
    if "accuracy" in dev:
        accuracy_ax.plot(dev["step"], dev["accuracy"], color="C1", marker="o", ms=4, lw=1.2)
    accuracy_ax.set_ylabel("accuracy", fontsize=_LABEL_SIZE)
    accuracy_ax.set_title("dev accuracy", fontsize=_TITLE_SIZE)
    for ax in (loss_ax, accuracy_ax):
        for step, rule in alerts:
            ax.axvline(step, color=ALERT_COLOUR, lw=0.9, ls="--", alpha=0.8)
            ax.annotate(
                rule, (step, 1), xycoords=("data", "axes fraction"), xytext=(2, -2),
                textcoords="offset points", rotation=90, va="top", fontsize=6, color=ALERT_COLOUR,
            )  # fmt: skip
        ax.set_xlabel("optimizer step", fontsize=_LABEL_SIZE)
        ax.tick_params(labelsize=_TICK_SIZE)
        ax.grid(alpha=0.3, lw=0.5)
    return figure


def statistic_curves(
    steps: np.ndarray,
    values: np.ndarray,
    name: str,
    *,
    columns: int = 6,
    marks: Sequence[tuple[int, int, int]] = (),
) -> Figure:
    """One panel per layer, one line per head: statistic ``name`` against the step.

    steps: [T] optimizer steps; values: [T, L, H] the statistic at each record (NaN: undefined).
    marks: (record, layer, head) points ringed in the alert colour (heads a training rule named).
    """
    _, layers, heads = values.shape
    across = min(columns, layers)
    down = math.ceil(layers / across)
    width, height = 2.3 * across + 0.6, 2.0 * down + 0.8
    # A fixed layout: constrained layout takes 2.5 times as long for these many small panels.
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    axes = figure.subplots(down, across, squeeze=False, sharex=True, sharey=True).ravel()
    figure.subplots_adjust(
        left=0.75 / width, right=1 - 0.1 / width, bottom=0.6 / height, top=1 - 0.55 / height, wspace=0.08,
        hspace=0.35 * down / max(down, 1),
    )  # fmt: skip
    for layer, ax in enumerate(axes[:layers]):
        for head in range(heads):
            colour = HEAD_COLOURS[head % len(HEAD_COLOURS)]
            ax.plot(
                steps, values[:, layer, head], color=colour, lw=1.1, marker="." if len(steps) < 30 else None
            )
        for record, head in [(record, head) for record, at, head in marks if at == layer]:
            ax.plot(
                steps[record], values[record, layer, head], "o", mfc="none", mec=ALERT_COLOUR, ms=7, mew=1.4
            )
        ax.set_title(f"layer {layer}", fontsize=_TITLE_SIZE)
        ax.tick_params(labelsize=_TICK_SIZE)
        ax.grid(alpha=0.3, lw=0.5)
    for ax in axes[layers:]:
        ax.remove()
    figure.supxlabel("optimizer step", fontsize=_LABEL_SIZE)
    figure.supylabel(unit_of(name), fontsize=_LABEL_SIZE)
    figure.suptitle(f"{title_of(name)} per head (colours as in the head view)", fontsize=_TITLE_SIZE)
    return figure


def change_heatmap(
    change: np.ndarray, top: Sequence[tuple[int, int]], alerted: Sequence[tuple[int, int]] = ()
) -> Figure:
    """Layer x head heatmap of ``change`` [L, H] with the heads in ``top`` outlined in red and those in
    ``alerted`` (named by a training rule) crossed in the alert colour."""
    table = HeadTable(columns={"attention_change": change}, defined_segments={}, segments=0)
    figure = heatmaps(table, ["attention_change"], unit="JS divergence (nats)")
    ax = figure.axes[0]
    for layer, head in top:
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.8))
    for layer, head in alerted:
        ax.plot(head, layer, "x", color=ALERT_COLOUR, ms=9, mew=2)
    title = "attention change per head (red: the most changed" + ("; ×: alerts)" if alerted else ")")
    ax.set_title(title, fontsize=_TITLE_SIZE)
    ax.set_xticks(index_ticks(change.shape[1]))
    return figure


def statistic_deltas(before: HeadTable, after: HeadTable, names: Sequence[str]) -> Figure:
    """Layer x head heatmaps of ``after - before`` for each statistic in ``names``."""
    delta = HeadTable(
        columns={name: after[name] - before[name] for name in names}, defined_segments={}, segments=0
    )
    return heatmaps(delta, names, columns=4, unit="after − before")
