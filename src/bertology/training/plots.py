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
from matplotlib.axes import Axes
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


#: Numbered alert marks on the training curves closer than this share of the x range go a row down.
_MARK_GAP = 0.04
#: Loss curves spanning more than this ratio are drawn on a log scale (a divergence next to 0.3 nats).
_LOG_SPAN = 100.0


def alert_steps(alerts: Sequence[tuple[int, str]]) -> list[tuple[int, list[str]]]:
    """The distinct steps of ``alerts`` ((step, rule name) pairs) in step order, each with its rules in
    their order of firing: mark ``i + 1`` on :func:`training_curves` is entry ``i``."""
    steps: dict[int, list[str]] = {}
    for step, rule in alerts:
        steps.setdefault(int(step), []).append(rule)
    return sorted(steps.items())


def _mark_alerts(ax: Axes, alerts: Sequence[tuple[int, str]]) -> None:
    """A dashed line at each alert step and a numbered mark at its top (:func:`alert_steps` numbers them;
    marks that would touch are stacked in rows, so none is drawn over another)."""
    low, high = ax.get_xlim()
    gap = _MARK_GAP * (high - low)
    last_in_row: list[float] = []
    for number, (step, _) in enumerate(alert_steps(alerts), start=1):
        row = next((r for r, x in enumerate(last_in_row) if step - x >= gap), len(last_in_row))
        if row == len(last_in_row):
            last_in_row.append(step)
        last_in_row[row] = step
        ax.axvline(step, color=ALERT_COLOUR, lw=0.9, ls="--", alpha=0.8)
        ax.annotate(
            str(number), (step, 1), xycoords=("data", "axes fraction"), xytext=(0, -8 - 11 * row),
            textcoords="offset points", ha="center", va="center", fontsize=6, color=ALERT_COLOUR,
            bbox={"boxstyle": "circle,pad=0.2", "fc": "white", "ec": ALERT_COLOUR, "lw": 0.7},
        )  # fmt: skip


def training_curves(
    metrics: pd.DataFrame, alerts: Sequence[tuple[int, str]] = (), losses: np.ndarray | None = None
) -> Figure:
    """Loss (the training loss of every step, its running mean, dev evaluations) and dev accuracy against
    the optimizer step.

    metrics: the rows of ``metrics.jsonl`` (columns ``step``, ``split``, ``loss``, ``accuracy``).
    alerts: (step, rule name) of the training rules' alerts, drawn as dashed lines with numbered marks
        (:func:`alert_steps`; the watch page's caption gives the key).
    losses: [P] the training loss of steps 1 to P (NaN: not recorded), e.g. the archive's ``losses``.
    Dev accuracies that are NaN (undefined: the logits were not finite) are marked and labelled.
    """
    figure = new_figure(9.0, 3.2)
    loss_ax, accuracy_ax = figure.subplots(1, 2)
    train = metrics[metrics["split"] == "train"]
    dev = metrics[metrics["split"] == "dev"]
    drawn = [train["loss"].to_numpy(float), dev["loss"].to_numpy(float)]
    if losses is not None and np.isfinite(losses).any():
        steps = np.arange(1, len(losses) + 1)
        loss_ax.plot(steps, losses, color="C0", lw=0.6, alpha=0.4, label="training (each step)")
        drawn.append(losses)
    few = len(train) < 30  # a line of one or two points needs its markers to be seen
    loss_ax.plot(train["step"], train["loss"], color="C0", lw=1.2, marker="." if few else None,
                 label="training (running mean)")  # fmt: skip
    loss_ax.plot(dev["step"], dev["loss"], color="C1", marker="o", ms=4, lw=1.2, label="dev")
    values = np.concatenate(drawn)
    values = values[np.isfinite(values) & (values > 0)]
    if values.size and values.max() > _LOG_SPAN * values.min():
        loss_ax.set_yscale("log")
    loss_ax.set_ylabel("cross-entropy (nats)", fontsize=_LABEL_SIZE)
    loss_ax.set_title("loss", fontsize=_TITLE_SIZE)
    loss_ax.legend(fontsize=_TICK_SIZE, frameon=False)
    if "accuracy" in dev:
        accuracy = dev["accuracy"].to_numpy(float)
        accuracy_ax.plot(dev["step"], accuracy, color="C1", marker="o", ms=4, lw=1.2)
        undefined = dev["step"].to_numpy()[np.isnan(accuracy)]
        if not np.isfinite(accuracy).any():
            accuracy_ax.set_ylim(0, 1)
        if undefined.size:
            accuracy_ax.plot(undefined, np.full(undefined.size, 0.05), "x", color="0.3", ms=6, mew=1.5,
                             transform=accuracy_ax.get_xaxis_transform(),
                             label="undefined: logits not finite")  # fmt: skip
            accuracy_ax.legend(fontsize=_TICK_SIZE, frameon=False, loc="lower left", bbox_to_anchor=(0, 0.1))
    accuracy_ax.set_ylabel("accuracy", fontsize=_LABEL_SIZE)
    accuracy_ax.set_title("dev accuracy", fontsize=_TITLE_SIZE)
    for ax in (loss_ax, accuracy_ax):
        ax.set_xlabel("optimizer step", fontsize=_LABEL_SIZE)
        ax.tick_params(labelsize=_TICK_SIZE)
        ax.grid(alpha=0.3, lw=0.5)
        if alerts:
            _mark_alerts(ax, alerts)
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
