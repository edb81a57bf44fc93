"""Dependency arcs of one sentence as inline SVG: gold arcs above the words, predicted arcs below,
wrapped onto several lines when the sentence is longer than a report is wide.

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
#: Widest line in px before a sentence wraps (a report's content column is 1,200 px at most).
LINE_WIDTH = 1000.0

#: Arc colours by kind.
COLOURS = {"gold": "#555555", "correct": "#1a7f37", "wrong": "#cf222e"}


@dataclass(frozen=True)
class Arc:
    """One arc: its SVG path data and its kind (a key of :data:`COLOURS`)."""

    path: str
    kind: str


def _word_spans(words: Sequence[str]) -> list[tuple[float, float]]:
    """(left, right) in px of each word laid out on one endless line."""
    spans, x = [], GAP
    for word in words:
        width = max(len(word), 1) * CHAR_WIDTH
        spans.append((x, x + width))
        x += width + GAP
    return spans


def _line_breaks(spans: Sequence[tuple[float, float]], width: float) -> list[tuple[int, int]]:
    """The words of each line, ``[(first, end)]``, as many as fit in ``width`` px (at least one)."""
    lines, first = [], 0
    for index, (_, right) in enumerate(spans):
        if index > first and right + GAP - (spans[first][0] - GAP) > width:
            lines.append((first, index))
            first = index
    lines.append((first, len(spans)))
    return lines


def _lift(distance: int) -> float:
    """Arc height in px for a dependency ``distance`` words long (capped at 12 words)."""
    return 18.0 + 10.0 * min(distance, 12)


def _arc(start: float, end: float, height: float, baseline: float, up: bool, kind: str) -> Arc:
    middle = baseline - height if up else baseline + height
    curve = f"C{start:.1f},{middle:.1f} {end:.1f},{middle:.1f} {end:.1f},{baseline:.1f}"
    return Arc(f"M{start:.1f},{baseline:.1f} {curve}", kind)


@dataclass(frozen=True)
class Line:
    """One line of a wrapped arc diagram: its size in px, arcs and words (x of each word's centre)."""

    width: str
    height: str
    arcs: list[Arc]
    words: list[tuple[str, str]]
    text_y: str


def arc_diagram(
    words: Sequence[str],
    gold: Sequence[int],
    predicted: Sequence[int],
    *,
    skip: Sequence[bool] | None = None,
    caption: str = "",
    width: float = LINE_WIDTH,
) -> Markup:
    """``<svg>`` lines of at most ``width`` px: ``gold`` heads above the words, ``predicted`` heads below
    (0-based, -1 root), in a ``<figure>`` with ``caption`` if one is given. A sentence too long for one
    line wraps: each line draws every arc that reaches it, an arc to a word on another line leaving at
    the line's edge (and coming back in on that word's line).

    skip: per word, draw no arc for it (e.g. punctuation, excluded from scoring).
    """
    spans = _word_spans(words)
    centres = [(left + right) / 2 for left, right in spans]
    pairs = []  # (from word, to word, kind, above)
    for dependent, (head, guess) in enumerate(zip(gold, predicted, strict=True)):
        if (skip is not None and skip[dependent]) or head < 0:
            continue
        pairs.append((head, dependent, "gold", True))
        if guess >= 0:
            pairs.append((guess, dependent, "correct" if guess == head else "wrong", False))
    lines = []
    for first, end in _line_breaks(spans, width):
        left = spans[first][0] - GAP
        reaching = [pair for pair in pairs if min(pair[:2]) < end and max(pair[:2]) >= first]
        rise = _lift(max((abs(a - b) for a, b, _, _ in reaching), default=1))
        top, bottom = rise + 8, rise + 40
        arcs = [
            _arc(centres[a] - left, centres[b] - left, _lift(abs(a - b)), top if up else bottom, up, kind)
            for a, b, kind, up in reaching
        ]
        lines.append(
            Line(
                width=f"{spans[end - 1][1] + GAP - left:.0f}",
                height=f"{bottom + rise + 8:.0f}",
                arcs=arcs,
                words=[(f"{centres[index] - left:.1f}", words[index]) for index in range(first, end)],
                text_y=f"{(top + bottom) / 2 + 4:.1f}",
            )
        )
    return Markup(render("arcs.html.j2", colours=COLOURS, lines=lines, caption=caption))
