"""The report of ``bertology compare``: two models' heads side by side, their matching and differences.

``report.html`` is a :mod:`bertology.report.page` page (no script). The head views of the two models on
one input are scripted pages, so they go into ``views.html`` beside it: two sandboxed ``<iframe
srcdoc>`` next to each other, whose Content-Security-Policy allows exactly the view pages' script (by its
SHA-256 hash) and nothing from outside.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import Colormap
from matplotlib.figure import Figure

from bertology.analysis import comparison as comparison_module
from bertology.analysis.comparison import HeadMatching, ModelComparison
from bertology.files.run_files import REPORT_FILE, mark_run
from bertology.interventions.ablation import AblationResult
from bertology.models.heads import head_name
from bertology.report import page, plots
from bertology.report.analysis import (
    CONFIDENCE,
    HEATMAP_STATISTICS,
    JS_DIVERGENCE,
    Figures,
    docstring,
)
from bertology.report.page import Markup, Section
from bertology.stats.base import HeadTable
from bertology.views import View
from bertology.views.page import inline_code_hashes

#: Most changed heads listed first.
TOP_HEADS = 10
#: Statistics drawn per layer against relative depth.
DEPTH_STATISTICS = ("confidence", "entropy", "cls", "sep", "punct", "previous", "next", "current")
#: Statistic changes named per head in the "most changed" table (attention weights; confidence has a column).
WEIGHT_STATISTICS = ("previous", "next", "current", "cls", "sep", "punct", "voita_confidence")
#: Width in CSS pixels of each heatmap in the side-by-side tables.
PANEL_WIDTH = 330
#: Height in CSS pixels of each view frame of ``views.html``.
VIEW_HEIGHT = 760
#: The file of the mean JS divergence between every head of A and every head of B.
CROSS_JS_DIVERGENCE_FILE = "cross_js_divergence.csv"


def relative_depth(layers: int) -> np.ndarray:
    """[layers] each layer's centre as a fraction of the depth, ``(layer + 1/2) / layers`` (0..1)."""
    return (np.arange(layers) + 0.5) / layers


def depth_figure(a: HeadTable, b: HeadTable, names: Sequence[str], labels: tuple[str, str]) -> Figure:
    """Per-layer means of the statistics ``names`` of two models against relative depth, so models with
    different numbers of layers line up; faint points are single heads. labels: the models' names."""
    columns = min(4, len(names))
    rows = -(-len(names) // columns)
    figure = plots.new_figure(3.3 * columns, 2.7 * rows + 0.4)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        for index, (table, label) in enumerate(zip((a, b), labels, strict=True)):
            values = table[name]
            depth = relative_depth(table.num_layers)
            colour, marker = f"C{index}", plots.MARKERS[index]
            ax.scatter(np.repeat(depth, table.num_heads), values.ravel(), s=7, alpha=0.25, color=colour, lw=0)
            ax.plot(depth, plots.layer_means(values), color=colour, marker=marker, ms=4, lw=1.6, label=label)
        ax.set_xlim(0, 1)
        ax.set_title(plots.title_of(name), fontsize=10)
        ax.set_xlabel("relative depth", fontsize=9)
        ax.set_ylabel(plots.unit_of(name), fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3, lw=0.5)
    for ax in axes[len(names) :]:
        ax.remove()
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncols=2, frameon=False)
    return figure


def distance_figure(matching: HeadMatching, shape_a: tuple[int, int], shape_b: tuple[int, int]) -> Figure:
    """The cross-model mean JS divergences ``[A heads, B heads]`` (layer-major, lines between layers) with
    the one-to-one matched pairs marked by white dots."""
    distance = matching.distance
    rows, columns = distance.shape
    figure = plots.new_figure(
        min(11.0, max(4.5, columns * 0.07 + 2.2)), min(10.0, max(3.8, rows * 0.07 + 1.4))
    )
    ax = figure.subplots()
    image = ax.imshow(distance, cmap=plots.COLORMAP, vmin=0, interpolation="nearest", aspect="auto")
    bar = figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("mean JS divergence per query unit (nats)", fontsize=8)
    matched = np.flatnonzero(matching.b_of_a >= 0)
    ax.scatter(matching.b_of_a[matched], matched, s=6, color="white", edgecolors="black", linewidths=0.3)
    for axis, (layers, heads) in (("x", shape_b), ("y", shape_a)):
        starts = np.arange(layers) * heads
        ticks = starts[plots.index_ticks(layers)]
        (ax.set_xticks if axis == "x" else ax.set_yticks)(ticks, [str(t // heads) for t in ticks])
        for start in starts[1:]:
            (ax.axvline if axis == "x" else ax.axhline)(start - 0.5, color="white", lw=0.4, alpha=0.7)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("model B head (ticks: first head of each layer)", fontsize=9)
    ax.set_ylabel("model A head", fontsize=9)
    return figure


def _heatmap(
    outdir: Path,
    name: str,
    statistic: str,
    values: np.ndarray,
    dpi: int,
    *,
    value_range: tuple[float, float],
    unit: str,
    cmap: Colormap = plots.COLORMAP,
) -> Markup:
    """``values`` [layers, heads] of ``statistic`` as a heatmap, saved as ``plots/<name>.png`` and shown
    :data:`PANEL_WIDTH` pixels wide."""
    png = plots.heatmap_png(
        outdir, name, {statistic: values}, dpi, value_range=value_range, unit=unit, cmap=cmap
    )
    return page.figure(png, alt=f"{plots.title_of(statistic)}, {name.replace('_', ' ')}", width=PANEL_WIDTH)


def _side_by_side(
    comparison: ModelComparison,
    names: Sequence[str],
    outdir: Path,
    dpi: int,
    *,
    fixed: tuple[float, float] | None,
) -> Markup:
    """A table, one row per statistic: A's heatmap, B's on the same colour scale and, when the shapes
    agree, B minus A head by head (same head numbers)."""
    cells: dict[str, list[Markup]] = {"model A": [], "model B": [], "B − A (same head)": []}
    for name in names:
        a, b = comparison.a.surface[name], comparison.b.surface[name]
        span = fixed or plots.value_range_of(a, b)
        unit = plots.unit_of(name)
        for side, values in (("A", a), ("B", b)):
            figure = _heatmap(
                outdir, f"{name}_{side.lower()}", name, values, dpi, value_range=span, unit=unit
            )
            cells[f"model {side}"].append(figure)
        if comparison.shapes_agree:
            delta = comparison.position_delta(name)
            span = plots.value_range_of(delta, symmetric=True)
            figure = _heatmap(
                outdir,
                f"{name}_delta",
                name,
                delta,
                dpi,
                value_range=span,
                unit=f"B − A, {unit}",
                cmap=plots.DIVERGING_COLORMAP,
            )
            cells["B − A (same head)"].append(figure)
    if not comparison.shapes_agree:
        del cells["B − A (same head)"]
    frame = pd.DataFrame({"statistic": [plots.title_of(name) for name in names], **{k: "" for k in cells}})
    return page.table(frame, markup=cells)


def _biggest_changes(row: pd.Series, count: int = 3) -> str:
    """The ``count`` weight statistics whose matched delta is largest in size, e.g. ``cls +0.31``."""
    deltas = {name: row[f"{name}_delta"] for name in WEIGHT_STATISTICS if np.isfinite(row[f"{name}_delta"])}
    largest = sorted(deltas, key=lambda name: -abs(deltas[name]))[:count]
    return ", ".join(f"{plots.title_of(name)} {deltas[name]:+.3f}" for name in largest)


def head_label(layer: float, head: float) -> str:
    """``"layer-head"`` (0-based) of a frame row's head, ``–`` where the model has none."""
    return page.MISSING if np.isnan(layer) else head_name(int(layer), int(head))


def most_changed_frame(comparison: ModelComparison, count: int = TOP_HEADS) -> pd.DataFrame:
    """The ``count`` most changed matched heads: both heads, the mean JS divergence, the labels, the entropy
    change and the largest changes of attention-weight statistics (B's matched head minus A's head)."""
    top = comparison.most_changed(count)
    return pd.DataFrame(
        {
            "rank": np.arange(1, len(top) + 1),
            "head A": [head_label(row.layer_a, row.head_a) for row in top.itertuples()],
            "head B": [head_label(row.layer_b, row.head_b) for row in top.itertuples()],
            JS_DIVERGENCE: top["js_divergence"],
            "label A → B": [f"{row.label_a} → {row.label_b}" for row in top.itertuples()],
            "entropy change (nats)": top["entropy_delta"],
            "confidence change": top["confidence_delta"],
            "largest weight changes": [_biggest_changes(row) for _, row in top.iterrows()],
        }
    )


def changed_heading(comparison: ModelComparison, top: int) -> tuple[str, str]:
    """The title and opening sentence of the report's first section: "Most changed heads" for a model and
    its own fine-tuned copy (:attr:`~bertology.analysis.comparison.ModelComparison.one_design`: B's heads
    are A's heads, changed); for two different models, the heads that differ most between them."""
    unit = "mean Jensen-Shannon divergence per query unit, nats, at most ln 2 ≈ 0.693"
    if comparison.one_design:
        return "Most changed heads", (
            f"The {top} matched head pairs whose attention differs most ({unit}), with B's matched head's "
            "statistics minus A's head's."
        )
    architectures = " and ".join(dict.fromkeys(comparison.model_types))
    design = (
        f"architectures ({architectures})"
        if comparison.model_types[0] != comparison.model_types[1]
        else "layers x heads or tokenizers"
    )
    return "Heads that differ most between the two models", (
        f"A ({comparison.a.model_name}) and B ({comparison.b.model_name}) are two models of different "
        f"{design}, not one model and its fine-tuned copy: each head of A is matched to the head of B that "
        f"attends most alike, and these are the {top} matched pairs that still differ most ({unit}), "
        "with B's matched head's statistics minus A's head's."
    )


def matching_frame(comparison: ModelComparison) -> pd.DataFrame:
    """Every row of :meth:`ModelComparison.to_frame` as the matching table: heads, mean JS divergences,
    nearest heads."""
    frame = comparison.to_frame()
    table = pd.DataFrame(
        {
            "head A": [head_label(a, b) for a, b in zip(frame["layer_a"], frame["head_a"], strict=True)],
            "matched head B": [
                head_label(a, b) for a, b in zip(frame["layer_b"], frame["head_b"], strict=True)
            ],
            JS_DIVERGENCE: frame["js_divergence"],
            "nearest B of head A": frame["nearest_b"].fillna(page.MISSING),
            "JS divergence (A → nearest B)": frame["nearest_b_js_divergence"],
            "nearest A of head B": frame["nearest_a"].fillna(page.MISSING),
            "JS divergence (B → nearest A)": frame["nearest_a_js_divergence"],
        }
    )
    if comparison.shapes_agree:
        table.insert(3, "same-number JS divergence", frame["same_head_js_divergence"])
    return table


def label_frame(comparison: ModelComparison) -> pd.DataFrame:
    """A's label, the matched B head and its label, per head (unmatched heads of B at the end)."""
    frame = comparison.to_frame()
    return pd.DataFrame(
        {
            "head A": [head_label(a, b) for a, b in zip(frame["layer_a"], frame["head_a"], strict=True)],
            "label A": frame["label_a"].fillna(page.MISSING),
            "matched head B": [
                head_label(a, b) for a, b in zip(frame["layer_b"], frame["head_b"], strict=True)
            ],
            "label B": frame["label_b"].fillna(page.MISSING),
            "same label": [
                "yes" if label_a == label_b else "no"
                for label_a, label_b in zip(frame["label_a"], frame["label_b"], strict=True)
            ],
        }
    )


def _label_counts(comparison: ModelComparison) -> pd.DataFrame:
    counts = [Counter(side.patterns.labels.ravel()) for side in (comparison.a, comparison.b)]
    names = sorted(set(counts[0]) | set(counts[1]), key=lambda name: (-counts[0][name], name))
    return pd.DataFrame(
        {
            "label": names,
            "heads of A": [counts[0][n] for n in names],
            "heads of B": [counts[1][n] for n in names],
        }
    )


def _ablation_section(
    ablations: tuple[AblationResult | str, AblationResult | str],
    names: tuple[str, str],
    outdir: Path,
    dpi: int,
) -> Section:
    found = [result.change for result in ablations if isinstance(result, AblationResult)]
    span = plots.value_range_of(*found, symmetric=True)
    blocks = [
        page.paragraph(
            "Dev accuracy with only that head removed (its output multiplied by 0) minus the accuracy with "
            "every head (Michel et al. 2019), both models on one colour scale; layer x head, 0-based."
        )
    ]
    for side, result, model in zip("AB", ablations, names, strict=True):
        if isinstance(result, str):
            blocks.append(page.paragraph(f"Model {side} ({model}): no ablation picture; {result}"))
            continue
        baseline = f"accuracy with every head {result.baseline:.4f} on {result.count} dev examples."
        blocks.append(page.paragraph(f"Model {side} ({model}): {baseline}"))
        name = f"ablation_{side.lower()}"
        blocks.append(
            _heatmap(
                outdir,
                name,
                "accuracy change",
                result.change,
                dpi,
                value_range=span,
                unit="accuracy change",
                cmap=plots.DIVERGING_COLORMAP,
            )
        )
    return Section("Single-head ablation", "ablation", blocks)


def views_page(views: tuple[View, View], caption: str) -> str:
    """A page with the two models' views next to each other, each in a sandboxed srcdoc iframe
    (template ``views_pair.html.j2``)."""
    policy = (
        f"default-src 'none'; script-src {inline_code_hashes()['script']}; style-src 'unsafe-inline'; "
        "img-src data: blob:; base-uri 'none'; form-action 'none'"
    )
    frames = [
        {"side": side, "model": view.data["model"], "html": view.html}
        for side, view in zip("AB", views, strict=True)
    ]
    return page.render(
        "views_pair.html.j2",
        title="Head views of both models",
        caption=caption,
        policy=policy,
        frames=frames,
        height=VIEW_HEIGHT,
    )


def _views_section(text: str) -> Section:
    return Section(
        "One input in both models",
        "views",
        [
            page.quotation("Input: ", text),
            page.paragraph(
                page.link("views.html", "Open the two head views side by side")
                + " (a page with script, so it is kept apart from this script-free report)."
            ),
        ],
    )


def write_comparison_report(
    comparison: ModelComparison,
    outdir: str | Path,
    *,
    views: tuple[View, View],
    input_text: str,
    ablations: tuple[AblationResult | str, AblationResult | str] | None = None,
    top: int = TOP_HEADS,
    dpi: int = 110,
) -> Path:
    """Write ``comparison.csv`` and ``comparison.json`` (:meth:`ModelComparison.to_frame` / ``to_json``),
    :data:`CROSS_JS_DIVERGENCE_FILE` (the mean JS divergence in nats, [A heads, B heads], ``layer-head``
    names), ``views.html`` (``views``: the head
    views of A and B on ``input_text``), the PNGs in ``plots/`` and ``report.html`` into ``outdir``.

    ablations: each model's single-head ablation, or a sentence saying why there is none.
    Returns the path of ``report.html``.
    """
    target = Path(outdir)
    (target / "plots").mkdir(parents=True, exist_ok=True)
    comparison.to_frame().to_csv(target / "comparison.csv", index=False)
    (target / "comparison.json").write_text(comparison.to_json(), encoding="utf-8")
    names_a = comparison_module.head_names(*comparison.shape_a)
    names_b = comparison_module.head_names(*comparison.shape_b)
    pd.DataFrame(comparison.matching.distance, index=names_a, columns=names_b).rename_axis("head A").to_csv(
        target / CROSS_JS_DIVERGENCE_FILE
    )
    caption = f"Model A: {comparison.a.model_name}. Model B: {comparison.b.model_name}. Input: {input_text}"
    (target / "views.html").write_text(views_page(views, caption), encoding="utf-8")

    figures = Figures(target / "plots", dpi)
    model_names = (comparison.a.model_name, comparison.b.model_name)
    level_note = (
        "The two tokenizers split text differently, so attention was compared at the word level: a query "
        "word's row is the mean of its pieces' rows and attention to a word the sum over its pieces."
        if comparison.level == "word"
        else "Both models use the same tokenizer, so attention was compared token by token."
    )
    heading, opening = changed_heading(comparison, top)
    sections = [
        Section(
            heading,
            "changed",
            [
                page.paragraph(opening),
                page.table(most_changed_frame(comparison, top), id_="changed-table"),
            ],
        ),
        Section(
            "Head matching",
            "matching",
            [
                page.paragraph(level_note),
                page.paragraph(
                    "Every head of A against every head of B on the same inputs; the dots are the optimal "
                    "one-to-one matching (smallest total divergence). With different head counts, the extra "
                    "heads of the larger model stay unmatched; each head's nearest head is listed as well."
                ),
                figures.embed(
                    "cross_js_divergence",
                    distance_figure(comparison.matching, comparison.shape_a, comparison.shape_b),
                    alt="Mean Jensen-Shannon divergence between every head of A and every head of B",
                    caption="Rows: heads of A, columns: heads of B, layer-major (ticks: layer numbers).",
                ),
                page.table(matching_frame(comparison), float_format="{:.4f}", id_="matching-table"),
            ],
        ),
        Section(
            "Statistics side by side",
            "statistics",
            [
                page.paragraph(
                    "Each head's mean over segments; A and B share a colour scale per statistic. "
                    + (
                        "The third column is B minus A at the same head number."
                        if comparison.shapes_agree
                        else "The models differ in shape, so see the curves by relative depth below."
                    )
                ),
                _side_by_side(
                    comparison,
                    [
                        name
                        for name in HEATMAP_STATISTICS
                        if np.isfinite(comparison.a.surface[name]).any()
                        or np.isfinite(comparison.b.surface[name]).any()
                    ],
                    target,
                    dpi,
                    fixed=None,
                ),
            ],
        ),
        Section(
            "By relative depth",
            "depth",
            [
                figures.embed(
                    "relative_depth",
                    depth_figure(comparison.a.surface, comparison.b.surface, DEPTH_STATISTICS, model_names),
                    alt="Per-layer means of both models against relative depth",
                    caption="Lines: the mean over a layer's heads, at the layer's relative depth "
                    "(layer + ½) / layers, so models with different numbers of layers line up; faint points: "
                    "single heads.",
                )
            ],
        ),
        Section(
            "Confidence",
            "confidence",
            [
                page.paragraph(
                    "Each head's mean largest attention weight: over every key, Voita et al. 2019's "
                    "confidence ([SEP], the end-of-sentence token, left out) and bertology's variant ([CLS] "
                    "and [SEP] left out), on one scale from 0 to 1."
                ),
                _side_by_side(comparison, CONFIDENCE, target, dpi, fixed=(0.0, 1.0)),
            ],
        ),
        Section(
            "Pattern labels",
            "labels",
            [
                page.table(_label_counts(comparison), id_="label-counts"),
                page.table(label_frame(comparison), id_="label-table"),
            ],
        ),
        _views_section(input_text),
    ]
    if ablations is not None:
        sections.append(_ablation_section(ablations, model_names, target, dpi))
    sections.append(
        Section("Method", "method", [page.docstring_html(docstring(comparison_module, summary=False))])
    )
    header = [
        page.definitions(comparison.summary()),
        page.paragraph(
            "Heads are numbered layer-head from 0 in every table, axis and file (e.g. 2-7: layer 2, head 7).",
            class_="muted",
        ),
    ]
    mark_run(target, "comparison", model=f"{comparison.a.model_name} vs {comparison.b.model_name}")
    report = target / REPORT_FILE
    title = f"Comparison: {comparison.a.model_name} and {comparison.b.model_name}"
    report.write_text(page.render_page(title, sections, header=header), encoding="utf-8")
    return report
