"""HTML reports of the linguistic probes (dependency relations), with CSV and PNG files beside them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertology.probes.dependency import ALL, DIRECTIONS, predicted_heads
from bertology.probes.gap import GapProbe
from bertology.probes.run import DependencyRun, ParserRun
from bertology.report import page, plots
from bertology.report.arcs import arc_diagram

#: Relations shown as heatmaps and arc diagrams: the most frequent ones.
MOST_RELATIONS = 12


def _best_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Table-1 rows of single relations (not the "all relations" row), most frequent first."""
    return table[table["relation"] != ALL].sort_values("count", ascending=False).head(MOST_RELATIONS)


def _heatmap_section(run: DependencyRun, rows: pd.DataFrame, outdir: Path, dpi: int) -> page.Section:
    columns = {
        f"{row.relation} ({DIRECTIONS[int(row.direction)]})": run.probe.heatmap(
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


def _arcs_section(run: DependencyRun, rows: pd.DataFrame) -> page.Section:
    blocks: list[page.Markup] = [
        page.paragraph(
            "For each relation, the first kept sentence that has it: gold arcs above the words, the arcs "
            "predicted by the relation's best head below (green: right head, red: wrong head)."
        )
    ]
    for row in rows.itertuples():
        found = next(((s, w) for s, w in run.examples if row.relation in s.relations), None)
        if found is None:
            continue
        sentence, words = found
        predicted = predicted_heads(words, int(row.layer), int(row.head), int(row.direction))
        caption = (
            f"{row.relation}: head ({row.layer}, {row.head}), {DIRECTIONS[int(row.direction)]} "
            f"({sentence.origin})"
        )
        blocks.append(arc_diagram(sentence.words, sentence.heads, predicted, caption=caption))
    return page.Section("Sentences", "sentences", blocks)


def write_dependency_report(run: DependencyRun, outdir: str | Path, *, dpi: int = 110) -> Path:
    """Write ``table.csv`` (Clark et al.'s Table 1 form), ``accuracies.csv`` (every relation, direction
    and head), ``plots/relation_heatmaps.png`` and ``report.html`` into ``outdir``; return the report."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    table = run.probe.table()
    table.to_csv(target / "table.csv", index=False)
    run.probe.to_frame().to_csv(target / "accuracies.csv", index=False)
    rows = _best_rows(table)
    sections = [
        page.Section(
            "Relations",
            "relations",
            [
                page.paragraph(
                    "Per relation, the single head whose attention argmax most often finds the gold head "
                    "word (heads are (layer, head), 0-based), beside the best fixed-offset baseline "
                    "(offsets -5..+5 from the dependent; the offset is given)."
                ),
                page.table(table, float_format="{:.3f}"),
            ],
        ),
        _heatmap_section(run, rows, target, dpi),
        _arcs_section(run, rows),
    ]
    header = [page.definitions(run.summary())]
    report = target / "report.html"
    report.write_text(
        page.render_page(f"Dependency probe: {run.model_name}", sections, header=header), encoding="utf-8"
    )
    return report


def write_parser_report(run: ParserRun, outdir: str | Path, *, dpi: int = 110) -> Path:
    """Write ``uas.csv`` (parser and baselines), ``parser_weights.csv`` (w, u and the training UAS of
    every head), ``parser.json``, ``plots/parser_weights.png``, ``plots/single_head_uas.png`` and
    ``report.html``; return the report."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    scores = run.report.to_frame()
    scores.to_csv(target / "uas.csv", index=False)
    heads = run.parser.to_frame()
    heads.to_csv(target / "parser_weights.csv", index=False)
    (target / "parser.json").write_text(run.report.to_json(), encoding="utf-8")
    layers, per_layer = run.parser.weights.shape[1:]
    grids = {name: heads[name].to_numpy().reshape(layers, per_layer) for name in heads.columns[2:]}
    weights = {name: grids.pop(name) for name in ("w", "u")}
    png = plots.heatmap_png(target, "parser_weights", weights, dpi, columns=2, unit="weight (log-linear)")
    alone_png = plots.heatmap_png(
        target, "single_head_uas", grids, dpi, value_range=(0.0, 1.0), columns=2, unit="UAS"
    )
    sections = [
        page.Section(
            "Unlabelled attachment score",
            "uas",
            [
                page.paragraph(
                    "UAS without punctuation on the evaluation treebank: the parser "
                    "p(i|j) ∝ exp(Σ_k w_k·a_k[j,i] + u_k·a_k[i,j]) over every head k, beside the "
                    "right-branching baseline and the single head (chosen on the training set) whose "
                    "attention argmax finds heads best."
                ),
                page.table(scores, float_format="{:.3f}"),
            ],
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
    report = target / "report.html"
    report.write_text(
        page.render_page(
            f"Attention-only parser: {run.model_name}", sections, header=[page.definitions(run.summary())]
        ),
        encoding="utf-8",
    )
    return report


def write_head_accuracy_report(
    outdir: str | Path,
    *,
    title: str,
    summary: dict[str, str | int | float],
    explanation: str,
    heatmap: np.ndarray,
    table: pd.DataFrame | None = None,
    accuracies: pd.DataFrame | None = None,
    dpi: int = 110,
) -> Path:
    """Report of a probe that scores every head once (coreference, GAP): ``heatmap: [layers, heads]``
    accuracies as ``plots/heads.png``, ``table`` (if any) as ``table.csv``, ``accuracies`` (if any: one row
    per head, in long form) as ``accuracies.csv``, and ``report.html``."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    png = plots.heatmap_png(
        target, "heads", {"accuracy": heatmap}, dpi, value_range=(0.0, 1.0), unit="accuracy"
    )
    blocks: list[page.Markup] = [page.paragraph(explanation)]
    if accuracies is not None:
        accuracies.to_csv(target / "accuracies.csv", index=False)
    if table is not None:
        table.to_csv(target / "table.csv", index=False)
        blocks.append(page.table(table, float_format="{:.3f}"))
    blocks.append(
        page.figure(png, alt="accuracy per head", caption="Accuracy of each head (layer x head, 0-based).")
    )
    report = target / "report.html"
    sections = [page.Section("Results", "results", blocks)]
    report.write_text(page.render_page(title, sections, header=[page.definitions(summary)]), encoding="utf-8")
    return report


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


def write_gap_report(
    probe: GapProbe, outdir: str | Path, *, title: str, summary: dict[str, str | int | float], dpi: int = 110
) -> Path:
    """Write GAP's scorecard for the best head and the baselines (``table.csv``), every head's scores
    (``heads.csv``), the counts (``gap.json``), ``plots/gender_split.png``, ``plots/heads.png`` (F1 per head
    overall, masculine, feminine) and ``report.html`` into ``outdir``; return the report."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    table = probe.table()
    table.to_csv(target / "table.csv", index=False)
    probe.to_frame().to_csv(target / "heads.csv", index=False)
    (target / "gap.json").write_text(probe.to_json(), encoding="utf-8")
    split = _gender_split_png(table, target, dpi)
    grids = {f"F1 {gender}": probe.heatmap(gender) for gender in ("overall", "masculine", "feminine")}
    heads = plots.heatmap_png(target, "heads", grids, dpi, value_range=(0.0, 1.0), columns=3, unit="F1")
    explanation = (
        "Scored as GAP's own scorer does (Webster et al. 2018): every example gives two decisions, whether "
        "name A and whether name B is coreferent with the pronoun, so examples where neither is count too; "
        "precision, recall and F1 overall and by the pronoun's gender, and the bias F1(feminine) / "
        "F1(masculine). A head picks the name its pronoun attends to more (word-level attention); the best "
        "head (0-based layer-head) has the best overall F1. Baselines: the nearest name in words, the "
        "syntactically nearest name and the parallel role (spaCy parses), always A, always B, both, neither."
    )
    blocks: list[page.Markup] = [page.paragraph(explanation)]
    if probe.syntax_note is not None:
        blocks.append(page.paragraph(f"Syntactic baselines left out: {probe.syntax_note}"))
    blocks += [
        page.table(table, float_format="{:.3f}"),
        page.figure(split, alt="F1 by gender", caption="Masculine and feminine F1 of every system."),
        page.figure(heads, alt="F1 per head", caption="F1 of each head (layer x head, 0-based)."),
    ]
    report = target / "report.html"
    sections = [page.Section("GAP scorecard", "scorecard", blocks)]
    report.write_text(page.render_page(title, sections, header=[page.definitions(summary)]), encoding="utf-8")
    return report
