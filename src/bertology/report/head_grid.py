"""An interactive layer x head heatmap for a report, without a script (the reports' Content-Security-Policy
allows none): each cell is a link whose tip shows the head's name and value on hover (or keyboard focus;
CSS ``:hover``, not a ``title``, so that it shows at once and in every browser), and a click
opens (CSS ``:target``) that head's attention on the first pair's clean and corrupted input, two small
query x key matrices with their tokens, inserted as text, in a panel fixed over the page's corner (so a click
in either of a page's two grids scrolls neither out of view); its close link goes to a fragment no element
has, which shuts the panel and scrolls nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from markupsafe import Markup

from bertology.models.heads import head_name
from bertology.report import page, plots

#: Attention weights are shown in this many shades (CSS classes ``w0`` .. ``w9``).
SHADES = 10


def _colour(value: float, limit: float) -> str:
    """The CSS colours of ``value``'s cell: its background on the reports' diverging colour map, centred at
    0, ``±limit`` its ends, and its text black, or white on the dark ends (relative luminance below 0.4)."""
    red, green, blue, _ = plots.DIVERGING_COLORMAP(0.5 + 0.5 * value / limit if limit > 0 else 0.5)
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue
    text = "#fff" if luminance < 0.4 else "#000"
    return f"background: rgb({round(red * 255)}, {round(green * 255)}, {round(blue * 255)}); color: {text}"


def _shades(weights: np.ndarray) -> list[list[int]]:
    """[queries][keys] the shade (0 .. SHADES - 1) of each attention weight (0 to 1)."""
    return np.clip(np.floor(weights * SHADES), 0, SHADES - 1).astype(int).tolist()


def head_grid(
    effect: np.ndarray,
    anchor: str,
    attention: dict[str, np.ndarray],
    tokens: tuple[Sequence[str], Sequence[str]],
    with_panels: bool = True,
) -> Markup:
    """The heatmap of ``effect`` [layers, heads] (``anchor``: a prefix of the heads' panel ids, unique in
    the page) and, per head, its panel of ``attention`` (``"clean"`` and ``"corrupted"``: [layers, heads,
    tokens, tokens] of the first pair, whose ``tokens`` are given, clean then corrupted); without
    ``attention`` the cells show their value only. ``with_panels=False``: the cells link to the panels of
    another grid of the page with the same ``anchor``."""
    low, high = plots.value_range_of(effect, symmetric=True)
    cells = [
        [
            (head_name(layer, head), f"{value:+.3f}", _colour(float(value), high))
            for head, value in enumerate(row)
        ]
        for layer, row in enumerate(effect)
    ]
    panels = []
    if attention and with_panels:
        for layer in range(effect.shape[0]):
            for head in range(effect.shape[1]):
                panels.append(
                    (
                        head_name(layer, head),
                        f"{effect[layer, head]:+.3f}",
                        [
                            (run, list(run_tokens), _shades(attention[run][layer, head]))
                            for run, run_tokens in zip(("clean", "corrupted"), tokens, strict=True)
                        ],
                    )
                )
    return Markup(
        page.render(
            "head_grid.html.j2",
            anchor=anchor,
            cells=cells,
            linked=bool(attention),
            panels=panels,
            low=low,
            high=high,
        )
    )
