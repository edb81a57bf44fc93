"""The files and report of an encoder-decoder's corpus analysis (:mod:`bertology.analysis.seq2seq`):
``heads.csv`` with a ``stack`` column, ``summary.json``, and ``report.html`` with a section per kind of
attention (encoder self-attention, decoder self-attention, cross-attention), and a folder per stack
(``encoder/``, ``decoder/``, ``cross/``) that holds it as an analysis of its own (``heads.csv`` without the
``stack`` column, ``head_js_divergence.csv``, ``summary.json``, marked as an analysis), which the web app's
explorer opens like any other; and of a comparison of two (``comparison.csv``, ``summary.json``,
``report.html`` with each stack's changes)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from bertology.analysis.patterns import PATTERN_DESCRIPTIONS
from bertology.analysis.seq2seq import (
    CROSS_DESCRIPTIONS,
    CROSS_STATISTICS,
    Seq2SeqAnalysis,
    Seq2SeqComparison,
)
from bertology.files.run_files import HEADS_FILE, JS_DIVERGENCE_FILE, REPORT_FILE, SUMMARY_FILE, mark_run
from bertology.report import page, plots
from bertology.report.analysis import write_js_divergence
from bertology.report.page import Markup, Section
from bertology.stats.base import HeadTable
from bertology.stats.surface import SURFACE_DESCRIPTIONS

#: The self-attention statistics drawn per stack (those undefined for every head are left out).
SELF_STATISTICS = ("previous", "next", "current", "cls", "sep", "punct", "sink", "entropy", "confidence")

#: Each stack's section: title, anchor and what its rows and columns are.
STACK_SECTIONS = {
    "encoder": (
        "Encoder self-attention",
        "encoder",
        "The source's tokens attending to each other, measured as an encoder's heads are: its end token "
        "(</s>) is in [SEP]'s role, BART's start token (<s>) in [CLS]'s (a T5 source has none).",
    ),
    "decoder": (
        "Decoder self-attention",
        "decoder",
        "The decoder's tokens attending to themselves and earlier ones, measured as a decoder's heads are: "
        "later keys are left out (attention to the next token is undefined, not 0), no [CLS] or [SEP].",
    ),
    "cross": (
        "Cross-attention",
        "cross",
        "Each decoder token (row) attending to the source's tokens (columns). Only the statistics defined "
        "between two different texts are measured; there is no pattern label.",
    ),
}


def _drawn(table: HeadTable, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name in table.columns and np.isfinite(table[name]).any()]


def _heatmaps(table: HeadTable, names: list[str], stack: str) -> Markup:
    png = plots.to_png(plots.heatmaps(table, names))
    return page.figure(
        png,
        alt=f"Layer by head heatmaps of the {stack} statistics",
        caption="Each head's mean over sources; layers top to bottom, heads left to right, both 0-based.",
    )


def _labels(analysis: Seq2SeqAnalysis, stack: str) -> Markup:
    counts = Counter(analysis.patterns[stack].labels.ravel().tolist())
    lines = {PATTERN_DESCRIPTIONS.get(label, label): count for label, count in counts.most_common()}
    return page.definitions({f"heads labelled {name}": count for name, count in lines.items()})


def _sections(analysis: Seq2SeqAnalysis) -> list[Section]:
    sections = []
    for stack, (title, anchor, text) in STACK_SECTIONS.items():
        if stack == "cross":
            table, names = analysis.cross, list(CROSS_STATISTICS)
            described = {name: CROSS_DESCRIPTIONS[name] for name in names}
            blocks = [page.paragraph(text), _heatmaps(table, names, stack), page.definitions(described)]
        else:
            table = analysis.surface[stack]
            names = _drawn(table, SELF_STATISTICS)
            described = {name: SURFACE_DESCRIPTIONS[name] for name in names}
            blocks = [
                page.paragraph(text),
                _heatmaps(table, names, stack),
                page.definitions(described),
                _labels(analysis, stack),
            ]
        sections.append(Section(title, anchor, blocks))
    return sections


def _save_stack(analysis: Seq2SeqAnalysis, stack: str, heads: pd.DataFrame, target: Path) -> None:
    """Write one stack's rows of ``heads`` (``stack`` column dropped, and for cross-attention the columns it
    does not define, its label ``"none"``), its JS divergences and a summary into ``target``, marked as an
    analysis."""
    target.mkdir(parents=True, exist_ok=True)
    rows = heads[heads["stack"] == stack].drop(columns="stack")
    if stack == "cross":
        rows = rows[["layer", "head", *CROSS_STATISTICS]].assign(label="none")
    rows.to_csv(target / HEADS_FILE, index=False)
    write_js_divergence(analysis.distances[stack], target / JS_DIVERGENCE_FILE)
    summary = {**analysis.summary(), "stack": stack, "seed": 0}
    (target / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    mark_run(target, "analysis", model=analysis.model_name)


def save_seq2seq_tables(analysis: Seq2SeqAnalysis, outdir: str | Path) -> Path:
    """Write ``heads.csv`` (:meth:`~bertology.analysis.seq2seq.Seq2SeqAnalysis.heads_frame`: a row per stack,
    layer and head), ``summary.json`` and a folder per stack (the module docstring) into ``outdir``, which
    is returned."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    heads = analysis.heads_frame()
    heads.to_csv(target / HEADS_FILE, index=False)
    (target / SUMMARY_FILE).write_text(json.dumps(analysis.summary(), indent=2), encoding="utf-8")
    for stack in STACK_SECTIONS:
        _save_stack(analysis, stack, heads, target / stack)
    return target


def save_seq2seq_analysis(analysis: Seq2SeqAnalysis, outdir: str | Path) -> Path:
    """Write the tables (:func:`save_seq2seq_tables`) and ``report.html`` into ``outdir``; returns the
    report's path."""
    target = save_seq2seq_tables(analysis, outdir)
    summary = analysis.summary()
    header = [
        page.definitions(
            {key.replace("_", " "): value for key, value in summary.items() if key != "decoder_reads"}
        ),
        page.paragraph(analysis.decoder_reads()),
        page.paragraph(
            "Heads are numbered (layer, head) from 0 in each stack; heads.csv has a row per stack (encoder, "
            "decoder, cross), layer and head. The folders encoder/, decoder/ and cross/ hold each stack as "
            "an analysis of its own, which bertology serve --runs opens in its explorer.",
            class_="muted",
        ),
    ]
    html = page.render_page(
        f"Attention analysis of {analysis.model_name}", _sections(analysis), header=header
    )
    report = target / REPORT_FILE
    report.write_text(html, encoding="utf-8")
    return report


#: A comparison's table: a row per stack, layer and head, both models' statistics and their change.
COMPARISON_FILE = "comparison.csv"

#: The changes drawn per stack.
CHANGED_STATISTICS = {
    "encoder": ("previous", "next", "sep", "punct", "entropy", "confidence"),
    "decoder": ("previous", "current", "sink", "punct", "entropy", "confidence"),
    "cross": ("sep", "punct", "entropy", "confidence", "diagonal"),
}


def save_seq2seq_comparison(comparison: Seq2SeqComparison, outdir: str | Path) -> Path:
    """Write :data:`COMPARISON_FILE` (:meth:`~bertology.analysis.seq2seq.Seq2SeqComparison.to_frame`),
    ``summary.json`` and ``report.html`` (heatmaps of each stack's changes, B - A) into ``outdir``; returns
    the report's path."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    comparison.to_frame().to_csv(target / COMPARISON_FILE, index=False)
    summary = comparison.summary()
    (target / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    sections = []
    for stack, (title, anchor, text) in STACK_SECTIONS.items():
        changes = comparison.changes(stack)
        names = _drawn(changes, CHANGED_STATISTICS[stack])
        limits = plots.value_range_of(*(changes[name] for name in names), symmetric=True)
        png = plots.to_png(plots.heatmaps(changes, names, value_range=limits, cmap=plots.DIVERGING_COLORMAP))
        figure = page.figure(
            png,
            alt=f"Layer by head heatmaps of the change of the {stack} statistics",
            caption="Each head's change, B minus A, of its mean over sources; layers top to bottom, heads "
            "left to right, both 0-based.",
        )
        sections.append(Section(title, anchor, [page.paragraph(text), figure]))
    header = [
        page.definitions(
            {key.replace("_", " "): value for key, value in summary.items() if key != "decoder_reads"}
        ),
        page.paragraph(str(summary["decoder_reads"])),
    ]
    title = f"{comparison.a.model_name} against {comparison.b.model_name}"
    report = target / REPORT_FILE
    report.write_text(page.render_page(title, sections, header=header), encoding="utf-8")
    return report
