"""The files of ``bertology heads --composition``: the Q-, K- and V-composition scores of every pair of
heads (:mod:`bertology.analysis.composition`) as a CSV table, JSON, one heatmap per kind and an HTML
report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from bertology.analysis.composition import COMPOSITION_KINDS, CompositionScores
from bertology.analysis.composition import __doc__ as DEFINITIONS
from bertology.files.run_files import REPORT_FILE, mark_run
from bertology.report import page, plots

#: The files written beside the report.
COMPOSITION_FILE = "composition.csv"
COMPOSITION_JSON = "composition.json"
#: Strongest pairs listed per kind.
LISTED_PAIRS = 10


def composition_figure(scores: CompositionScores, kind: str) -> Figure:
    """[earlier head, later head] heatmap of the ``kind`` scores, heads ordered layer by layer (grey where
    not scored: the later head not in a later layer), lines between layers."""
    matrix = scores.matrix(kind)
    layers, heads = scores.scores[kind].shape[:2]
    side = min(9.0, max(3.5, 0.04 * len(matrix) + 2.5))
    figure = plots.new_figure(side + 1.0, side)
    ax = figure.subplots()
    ax.set_facecolor(plots.NAN_COLOUR)
    image = ax.imshow(matrix, cmap=plots.COLORMAP, vmin=0.0, interpolation="nearest", aspect="equal")
    bar = figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
    bar.set_label("composition score", fontsize=8)
    for edge in np.arange(1, layers) * heads - 0.5:
        ax.axhline(edge, color="white", lw=0.4)
        ax.axvline(edge, color="white", lw=0.4)
    ticks = plots.index_ticks(layers) * heads + (heads - 1) / 2
    labels = [str(layer) for layer in plots.index_ticks(layers)]
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlabel("later head (by layer)", fontsize=8)
    ax.set_ylabel("earlier head (by layer)", fontsize=8)
    ax.set_title(f"{kind.upper()}-composition", fontsize=9)
    return figure


def write_composition(scores: CompositionScores, outdir: str | Path, *, dpi: int = 110) -> Path:
    """Write ``scores`` into ``outdir``: :data:`COMPOSITION_FILE` (a row per pair and kind: layer_a, head_a,
    layer_b, head_b, kind, score), :data:`COMPOSITION_JSON`, ``plots/composition_<kind>.png`` per kind and
    ``report.html`` and the folder's mark (:func:`~bertology.files.run_files.mark_run`); return the report."""
    target = Path(outdir)
    (target / "plots").mkdir(parents=True, exist_ok=True)
    scores.to_frame().to_csv(target / COMPOSITION_FILE, index=False)
    (target / COMPOSITION_JSON).write_text(scores.to_json(), encoding="utf-8")
    mark_run(target, "composition", model=scores.model_name)
    sections = []
    for kind in COMPOSITION_KINDS:
        png = plots.to_png(composition_figure(scores, kind), dpi=dpi)
        (target / "plots" / f"composition_{kind}.png").write_bytes(png)
        top = scores.to_frame().query("kind == @kind").nlargest(LISTED_PAIRS, "score")
        sections.append(
            page.Section(
                f"{kind.upper()}-composition",
                f"composition-{kind}",
                [
                    page.figure(
                        png, alt=f"{kind}-composition scores", caption="Heads 0-based, layer by layer."
                    ),
                    page.paragraph(f"The {LISTED_PAIRS} strongest pairs (0-based):"),
                    page.table(top.drop(columns="kind"), float_format="{:.4f}"),
                ],
            )
        )
    sections.append(page.Section("Definitions", "definitions", [page.docstring_html(DEFINITIONS or "")]))
    layers, heads = scores.scores["q"].shape[:2]
    header = [page.definitions({"model": scores.model_name, "layers x heads": f"{layers} x {heads}"})]
    report = target / REPORT_FILE
    report.write_text(
        page.render_page(f"Composition scores: {scores.model_name}", sections, header=header),
        encoding="utf-8",
    )
    return report
