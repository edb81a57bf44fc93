"""Dependency arcs of one sentence as inline SVG: gold arcs above the words, predicted arcs below.

A predicted arc that matches the gold head is drawn in the "correct" colour, a wrong one in the
"wrong" colour; punctuation and root words draw no arc. The SVG is the template ``arcs.html.j2``; words
are SVG text nodes, escaped by its autoescape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from bertology.report.page import render

CHAR_WIDTH = 7.2  # px per character of the 12 px label font
GAP = 14.0  # px between words

#: Arc colours by kind.
COLOURS = {"gold": "#555555", "correct": "#1a7f37", "wrong": "#cf222e"}


@dataclass(frozen=True)
class Arc:
    """One arc: its SVG path data and its kind (a key of :data:`COLOURS`)."""

    path: str
    kind: str


def _word_centres(words: Sequence[str]) -> tuple[list[float], float]:
    centres, x = [], GAP
    for word in words:
        width = max(len(word), 1) * CHAR_WIDTH
        centres.append(x + width / 2)
        x += width + GAP
    return centres, x


def _lift(distance: int) -> float:
    """Arc height in px for a dependency ``distance`` words long (capped at 12 words)."""
    return 18.0 + 10.0 * min(distance, 12)


def _arc(start: float, end: float, height: float, baseline: float, up: bool, kind: str) -> Arc:
    middle = baseline - height if up else baseline + height
    curve = f"C{start:.1f},{middle:.1f} {end:.1f},{middle:.1f} {end:.1f},{baseline:.1f}"
    return Arc(f"M{start:.1f},{baseline:.1f} {curve}", kind)


def arc_diagram(
    words: Sequence[str],
    gold: Sequence[int],
    predicted: Sequence[int],
    *,
    skip: Sequence[bool] | None = None,
    caption: str = "",
) -> Markup:
    """An ``<svg>``: ``gold`` heads above the words, ``predicted`` heads below (0-based, -1 root), in a
    ``<figure>`` with ``caption`` if one is given.

    skip: per word, draw no arc for it (e.g. punctuation, excluded from scoring).
    """
    centres, width = _word_centres(words)
    spans = [abs(h - d) for heads in (gold, predicted) for d, h in enumerate(heads) if h >= 0]
    rise = _lift(max(spans, default=1))
    baseline_top, baseline_bottom = rise + 8, rise + 40
    arcs = []
    for dependent, (head, guess) in enumerate(zip(gold, predicted, strict=True)):
        if (skip is not None and skip[dependent]) or head < 0:
            continue
        arcs.append(
            _arc(centres[head], centres[dependent], _lift(abs(head - dependent)), baseline_top, True, "gold")
        )
        if guess >= 0:
            kind = "correct" if guess == head else "wrong"
            lift = _lift(abs(guess - dependent))
            arcs.append(_arc(centres[guess], centres[dependent], lift, baseline_bottom, False, kind))
    return Markup(
        render(
            "arcs.html.j2",
            width=f"{width:.0f}",
            height=f"{baseline_bottom + rise + 8:.0f}",
            colours=COLOURS,
            arcs=arcs,
            words=[(f"{centre:.1f}", word) for centre, word in zip(centres, words, strict=True)],
            text_y=f"{(baseline_top + baseline_bottom) / 2 + 4:.1f}",
            caption=caption,
        )
    )
