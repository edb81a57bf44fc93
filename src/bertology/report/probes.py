"""HTML reports of the linguistic probes: :func:`write_probe_report` writes a probe result's data files
(:meth:`~bertology.probes.base.ProbeResult.save`), its plots (PNG, under ``plots/``) and ``report.html``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertology.files.run_files import ANTECEDENTS_FILE, REPORT_FILE, mark_run
from bertology.probes.base import ProbeResult
from bertology.probes.dependency import ALL, DIRECTIONS, predicted_heads
from bertology.probes.results import CoreferenceResult, DependencyResult, GapResult, ParserResult
from bertology.report import page, plots
from bertology.report.arcs import arc_diagram

#: Relations shown as heatmaps and arc diagrams: the most frequent ones.
MOST_RELATIONS = 12


def _best_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Table-1 rows of single relations (not the "all relations" row), most frequent first."""
    return table[table["relation"] != ALL].sort_values("count", ascending=False).head(MOST_RELATIONS)


def _heatmap_section(result: DependencyResult, rows: pd.DataFrame, outdir: Path, dpi: int) -> page.Section:
    columns = {
        f"{row.relation} ({DIRECTIONS[int(row.direction)]})": result.probe.heatmap(
            row.relation, int(row.direction)
        )
        for row in rows.itertuples()
    }
    png = plots.heatmap_png(
        outdir, "relation_heatmaps", columns, dpi, value_range=(0.0, 1.0), columns=4, unit="accuracy"
    )
    caption = (
        "Accuracy of each head (layer x head, 0-based) at predicting the relation's head word as the "
        "argmax of its attention, in the relation's best direction."
    )
    return page.Section(
        "Heads per relation", "heatmaps", [page.figure(png, alt="relation heatmaps", caption=caption)]
    )


def _arcs_section(result: DependencyResult, rows: pd.DataFrame) -> page.Section:
    blocks: list[page.Markup] = [
        page.paragraph(
            "For each relation, the first kept sentence that has it and is not shown for another relation "
            "already (or the first that has it, if every one is): gold arcs above the words, the arcs "
            "predicted by the relation's best head below (green: right head, red: wrong head)."
        )
    ]
    shown: set[int] = set()
    for row in rows.itertuples():
        having = [index for index, (s, _) in enumerate(result.examples) if row.relation in s.relations]
        if not having:
            continue
        chosen = next((index for index in having if index not in shown), having[0])
        shown.add(chosen)
        sentence, words = result.examples[chosen]
        predicted = predicted_heads(words, int(row.layer), int(row.head), int(row.direction))
        caption = (
            f"{row.relation}: head ({row.layer}, {row.head}), {DIRECTIONS[int(row.direction)]} "
            f"({sentence.origin})"
        )
        blocks.append(arc_diagram(sentence.words, sentence.heads, predicted, caption=caption))
    return page.Section("Sentences", "sentences", blocks)


def _dependency_sections(result: DependencyResult, target: Path, dpi: int) -> list[page.Section]:
    """Clark et al.'s Table 1, ``plots/relation_heatmaps.png`` and arc diagrams of kept sentences."""
    table = result.table()
    rows = _best_rows(table)
    return [
        page.Section(
            "Relations",
            "relations",
            [page.paragraph(result.explanation), page.table(table, float_format="{:.3f}")],
        ),
        _heatmap_section(result, rows, target, dpi),
        _arcs_section(result, rows),
    ]


def _parser_sections(result: ParserResult, target: Path, dpi: int) -> list[page.Section]:
    """The UAS table, ``plots/parser_weights.png`` (w and u per head) and ``plots/single_head_uas.png``
    (each head's training UAS in each direction)."""
    weights = {name: result.grid(name) for name in ("w", "u")}
    alone = {f"train_uas_{name}": result.grid(f"train_uas_{name}") for name in DIRECTIONS}
    png = plots.heatmap_png(target, "parser_weights", weights, dpi, columns=2, unit="weight (log-linear)")
    alone_png = plots.heatmap_png(
        target, "single_head_uas", alone, dpi, value_range=(0.0, 1.0), columns=2, unit="UAS"
    )
    return [
        page.Section(
            "Unlabelled attachment score",
            "uas",
            [page.paragraph(result.explanation), page.table(result.table(), float_format="{:.3f}")],
        ),
        page.Section(
            "Weights per head",
            "weights",
            [
                page.figure(
                    png,
                    alt="parser weights",
                    caption="w: weight of the dependent's attention to the candidate head; u: of the "
                    "candidate head's attention to the dependent (layer x head, 0-based).",
                ),
                page.figure(
                    alone_png,
                    alt="single-head UAS",
                    caption="Each head alone: training UAS of its attention argmax, in each direction.",
                ),
            ],
        ),
    ]


def _coreference_sections(result: CoreferenceResult, target: Path, dpi: int) -> list[page.Section]:
    """Clark et al.'s Table 2 and ``plots/heads.png`` (every head's accuracy over all mentions)."""
    png = plots.heatmap_png(
        target, "heads", {"accuracy": result.grid()}, dpi, value_range=(0.0, 1.0), unit="accuracy"
    )
    blocks = [
        page.paragraph(result.explanation),
        page.table(result.table(), float_format="{:.3f}"),
        page.figure(png, alt="accuracy per head", caption="Accuracy of each head (layer x head, 0-based)."),
        page.paragraph(
            f"{ANTECEDENTS_FILE}: for every scored mention (its words in the document, 0-based, end "
            f"excluded), the antecedent the best head over all mentions ({result.best().label}) picks, "
            "whether it is right, the gold antecedents' head words, and whether each baseline is right."
        ),
    ]
    return [page.Section("Results", "results", blocks)]


def _gender_split_png(table: pd.DataFrame, outdir: Path, dpi: int) -> bytes:
    """Bars of masculine and feminine F1 for every system of GAP's scorecard (``plots/gender_split.png``)."""
    figure = plots.new_figure(max(5.0, 0.8 * len(table) + 1.5), 3.4)
    ax = figure.subplots()
    positions = np.arange(len(table))
    for offset, gender, colour in ((-0.2, "masculine", "#4c72b0"), (0.2, "feminine", "#dd8452")):
        ax.bar(positions + offset, table[f"{gender}_f1"], width=0.4, label=gender, color=colour)
    for position, bias in zip(positions, table["bias_f_m"], strict=True):
        if np.isfinite(bias):
            ax.annotate(f"{bias:.2f}", (position, 1.02), ha="center", fontsize=8)
    ax.set_xticks(positions, table["system"], rotation=30, ha="right")
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("F1")
    ax.set_title("F1 by the pronoun's gender (numbers above: bias F/M)")
    ax.legend(loc="upper right", fontsize=8)
    png = plots.to_png(figure, dpi=dpi)
    (outdir / "plots").mkdir(parents=True, exist_ok=True)
    (outdir / "plots" / "gender_split.png").write_bytes(png)
    return png


def _gap_sections(result: GapResult, target: Path, dpi: int) -> list[page.Section]:
    """GAP's scorecard, ``plots/gender_split.png`` and ``plots/heads.png`` (F1 per head overall,
    masculine, feminine)."""
    table = result.table()
    split = _gender_split_png(table, target, dpi)
    grids = {f"F1 {gender}": result.grid(gender) for gender in ("overall", "masculine", "feminine")}
    heads = plots.heatmap_png(target, "heads", grids, dpi, value_range=(0.0, 1.0), columns=3, unit="F1")
    blocks: list[page.Markup] = [page.paragraph(result.explanation)]
    if result.probe.syntax_note is not None:
        blocks.append(page.paragraph(f"Syntactic baselines left out: {result.probe.syntax_note}"))
    blocks += [
        page.table(table, float_format="{:.3f}"),
        page.figure(split, alt="F1 by gender", caption="Masculine and feminine F1 of every system."),
        page.figure(heads, alt="F1 per head", caption="F1 of each head (layer x head, 0-based)."),
    ]
    if files := result.prediction_files:
        best = next(iter(files.values()))
        blocks.append(
            page.paragraph(
                "Every system's answer to every example, as GAP's own scorer reads system output (ID, "
                f"A-coref, B-coref; tab-separated, no header): {', '.join(files.values())}. Score one with "
                f"`python gap_scorer.py --gold_tsv {Path(result.gap_file).name} --system_tsv {best}`; the "
                "gold file must hold the examples probed and no others (the first ones, with a limit). An "
                "example cut to fit the model has no line in a head's file (a missing output, as above)."
            )
        )
    return [page.Section("GAP scorecard", "scorecard", blocks)]


def _sections(result: ProbeResult, target: Path, dpi: int) -> list[page.Section]:
    """The report's sections for the result's kind of probe."""
    if isinstance(result, DependencyResult):
        return _dependency_sections(result, target, dpi)
    if isinstance(result, ParserResult):
        return _parser_sections(result, target, dpi)
    if isinstance(result, CoreferenceResult):
        return _coreference_sections(result, target, dpi)
    if isinstance(result, GapResult):
        return _gap_sections(result, target, dpi)
    raise TypeError(f"No report for a {type(result).__name__}.")


def write_probe_report(result: ProbeResult, folder: str | Path, *, dpi: int = 110) -> Path:
    """Write the result's data files (:attr:`~bertology.probes.base.ProbeResult.files`), its plots
    (``plots/*.png``) and ``report.html`` (the summary, what is measured, the table and the plots) into
    ``folder``; return the report."""
    target = Path(folder)
    result.save(target)
    mark_run(target, "probe", model=result.model_name, probe=result.kind)
    sections = _sections(result, target, dpi)
    header = [page.definitions(result.summary())]
    report = target / REPORT_FILE
    report.write_text(
        page.render_page(f"{result.title}: {result.model_name}", sections, header=header), encoding="utf-8"
    )
    return report
