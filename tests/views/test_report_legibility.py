"""Report figures a person can read: wrapped dependency arcs, per-layer panels scaled to their values,
heatmap rows no wider than a report (issue 25, item 17)."""

from __future__ import annotations

import re

import numpy as np

from bertology.report.arcs import LINE_WIDTH, arc_diagram
from bertology.report.plots import PAGE_WIDTH, heatmaps, layer_summary
from bertology.stats.base import HeadTable


def test_a_long_sentence_wraps_onto_lines_no_wider_than_the_report() -> None:
    words = [f"word{index}" for index in range(80)]
    gold = [-1] + [0] * 79  # every word depends on the first
    html = str(arc_diagram(words, gold, [-1] * 80))
    widths = [float(width) for width in re.findall(r'<svg[^>]* width="([\d.]+)"', html)]
    assert len(widths) >= 3 and max(widths) <= LINE_WIDTH
    drawn = re.findall(r">(word\d+)</text>", html)
    assert drawn == words  # every word once, in order
    # each line draws the arcs reaching it: the last line's words still get their arcs from word0
    last_line = html.rsplit("<svg", 1)[1]
    assert last_line.count('fill="none"') == sum(1 for word in drawn if f">{word}<" in last_line)


def test_a_short_sentence_stays_one_line() -> None:
    html = str(arc_diagram(["The", "cat", "sat"], [1, 2, -1], [1, 2, -1]))
    assert html.count("<svg") == 1


def _table(**columns: np.ndarray) -> HeadTable:
    return HeadTable(columns=columns, defined_segments={}, segments=1)


def test_per_layer_panels_are_scaled_to_their_values() -> None:
    small = np.full((6, 12), 0.02) + np.linspace(0, 0.004, 72).reshape(6, 12)
    figure = layer_summary(_table(sep=small, cls=small * 20), {"small": ["sep"], "large": ["cls"]})
    (low, high), (_, large_high) = (ax.get_ylim() for ax in figure.axes)
    assert low < 0 < 0.024 < high < 0.03  # not a 0-1 axis for values near 0.02
    assert 0.48 < large_high < 0.52


def test_heatmap_rows_are_no_wider_than_a_report() -> None:
    grids = {f"relation {index}": np.random.default_rng(index).random((6, 12)) for index in range(12)}
    figure = heatmaps(_table(**grids), list(grids), columns=4)
    assert figure.get_figwidth() <= PAGE_WIDTH
