"""The files of ``bertology heads``: the heads' detector and sink scores
(:mod:`bertology.analysis.head_detectors`) as a table, JSON, one layer x head heatmap per score, head
views of the strongest heads on a repeated random sequence, and an HTML report linking them."""

from __future__ import annotations

from pathlib import Path

from bertology.analysis.head_detectors import HEAD_SCORES, SCORE_DESCRIPTIONS, HeadDetection
from bertology.analysis.head_detectors import __doc__ as DEFINITIONS
from bertology.attention.capturing import Attention
from bertology.files.run_files import REPORT_FILE, mark_run
from bertology.models.heads import head_name
from bertology.report import page, plots
from bertology.views import render_view

#: The files written beside the report.
SCORES_FILE = "head_scores.csv"
SCORES_JSON = "head_scores.json"
#: Heads per score shown in a head view.
VIEWED_HEADS = 3


def view_name(score: str, layer: int, head: int) -> str:
    """The head view file of a head among a score's strongest, relative to the output folder."""
    return f"views/{score}_L{layer}_H{head}.html"


def _score_section(detection: HeadDetection, name: str, png: bytes) -> page.Section:
    """A score's heatmap, its strongest heads and links to their views on the repeated sequence."""
    links = [
        page.link(view_name(name, layer, head), f"{head_name(layer, head)} ({score:.3f})")
        for layer, head, score in detection.top(name, VIEWED_HEADS)
    ]
    return page.Section(
        plots.title_of(name).capitalize(),
        name,
        [
            page.paragraph(
                f"{SCORE_DESCRIPTIONS[name].capitalize()}; threshold for the label: "
                f"{getattr(detection.thresholds, name)}. Strongest heads (0-based layer and head), each "
                "linked to its head view on the first repeated random sequence:"
            ),
            *links,
            page.figure(png, alt=f"{name} score per head", caption="Layer x head, 0-based."),
        ],
    )


def write_head_detection(
    detection: HeadDetection, repeated: Attention, outdir: str | Path, *, dpi: int = 110
) -> Path:
    """Write ``detection`` into ``outdir``: :data:`SCORES_FILE` (a row per head), :data:`SCORES_JSON`,
    ``plots/<score>.png`` per score, ``views/<score>_L<layer>_H<head>.html`` (head views of each score's
    :data:`VIEWED_HEADS` strongest heads on ``repeated``, the attention of a repeated random sequence, one
    layer each), ``report.html`` and the folder's mark (:func:`~bertology.files.run_files.mark_run`); return
    the report."""
    target = Path(outdir)
    (target / "views").mkdir(parents=True, exist_ok=True)
    detection.to_frame().to_csv(target / SCORES_FILE, index=False)
    (target / SCORES_JSON).write_text(detection.to_json(), encoding="utf-8")
    mark_run(target, "heads", model=detection.model_name)
    sections = []
    for name in HEAD_SCORES:
        png = plots.heatmap_png(
            target, name, {name: detection.scores[name]}, dpi, unit="attention mass", value_range=(0.0, 1.0)
        )
        for layer, head, _ in detection.top(name, VIEWED_HEADS):
            view = render_view(
                repeated, kind="head", layer=layer, heads=[head], include_layers=[layer], prettify_tokens=True
            )
            view.save(target / view_name(name, layer, head))
        sections.append(_score_section(detection, name, png))
    labels = detection.to_frame().groupby("labels").size().rename("heads").reset_index()
    sections.append(page.Section("Labels", "labels", [page.table(labels)]))
    sections.append(page.Section("Definitions", "definitions", [page.docstring_html(DEFINITIONS or "")]))
    header = [
        page.definitions(
            {
                "model": detection.model_name,
                "repeated random tokens": f"{detection.sequences} sequences of 2 x {detection.length} "
                f"tokens (seed {detection.seed})",
                "sink corpus": f"{detection.segments} segments of {detection.corpus}",
            }
        )
    ]
    if detection.note:
        header.insert(0, page.paragraph(f"Note: {detection.note}.", class_="warning"))
    report = target / REPORT_FILE
    title = f"Decoder head detectors: {detection.model_name}"
    report.write_text(page.render_page(title, sections, header=header), encoding="utf-8")
    return report
