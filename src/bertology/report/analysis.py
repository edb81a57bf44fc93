"""The files and HTML report of ``bertology analyze``, in the style of Clark et al. 2019 ("What Does BERT
Look At?").

:func:`save_analysis` writes a :class:`~bertology.analysis.analyze.CorpusAnalysis` as CSV and JSON files, an
example head view per labelled head and the report. :func:`write_analysis_report` draws the figures of
:mod:`bertology.report.plots`, saves each as ``plots/<name>.png`` and writes ``report.html`` with the same
images inline: layer x head heatmaps of the surface statistics, per-layer summaries (Clark et al., Figs.
2-4), Voita et al.'s confidence, a map of the heads by their mean Jensen-Shannon divergence (Fig. 6),
the label of every head, the closest head pairs, and the definition of every statistic and label, read
from the docstrings of the functions that compute them (in the convention the statistics were computed
in) so the report always states what the code does.
"""

from __future__ import annotations

import inspect
import json
import re
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bertology.analysis import distances as distances_module
from bertology.analysis import patterns as patterns_module
from bertology.analysis.analyze import CorpusAnalysis, example_segments
from bertology.analysis.examples import EXAMPLE_MAX_TOKENS, EXAMPLES_FILE, chosen_examples, collect_examples
from bertology.analysis.head_detectors import DETECTORS, REPEATED_LENGTH, SCORE_DESCRIPTIONS, detector_scores
from bertology.analysis.patterns import (
    DECODER_LABELS,
    LABEL_DESCRIPTIONS,
    PATTERN_DESCRIPTIONS,
    DetectorThresholds,
    HeadPatterns,
    decoder_labels,
    label_heads,
)
from bertology.attention.capturing import capture
from bertology.attention.norms import WEIGHT_DESCRIPTIONS
from bertology.errors import BertologyError, TruncationWarning
from bertology.files.run_files import (
    DETECTORS_FILE,
    HEADS_FILE,
    JS_DIVERGENCE_FILE,
    REPORT_FILE,
    SUMMARY_FILE,
    mark_run,
)
from bertology.models.heads import head_name
from bertology.progress import Progress, stage
from bertology.report import page, plots
from bertology.report.page import Markup, Section
from bertology.stats import surface as surface_module
from bertology.stats.base import HeadTable
from bertology.stats.surface import SURFACE_STATISTICS, Convention, statistics_of
from bertology.views import head_view

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from bertology.analysis.distances import HeadDistances
    from bertology.models.loading import LoadedModel

#: (statistic, uniform baseline) pairs of the entropy figure; [CLS] entropy only when defined.
ENTROPY_PANELS = (("entropy", "entropy_uniform"), ("cls_entropy", "cls_entropy_uniform"))

#: The largest attention weight, Voita et al.'s confidence ([SEP] left out) and bertology's variant
#: without [CLS] and [SEP], drawn on one colour scale.
CONFIDENCE = ("confidence", "voita_confidence", "confidence_without_delimiters")

#: The file of the heads' mean Jensen-Shannon divergences, ``[heads, heads]`` with ``layer-head`` names.

#: Column and caption name of the mean Jensen-Shannon divergence between two heads.
JS_DIVERGENCE = "mean JS divergence (nats)"

#: Per-layer summary panels: title -> statistics (Clark et al. 2019, Figs. 2 and 3).
LAYER_PANELS = {
    "To [CLS], [SEP] and punctuation (cf. Clark Fig. 2)": ("cls", "sep", "punct"),
    "To [SEP], from [SEP] and others (cf. Clark Fig. 3)": ("other_to_sep", "sep_to_sep"),
}

#: Surface statistics with a heatmap: all but the entropy baselines and the confidence variants.
HEATMAP_STATISTICS = tuple(
    name
    for name in SURFACE_STATISTICS
    if name not in {baseline for _, baseline in ENTROPY_PANELS} and name not in CONFIDENCE
)

#: Closest head pairs listed.
CLOSEST_PAIRS = 20


def docstring(obj: object, *, summary: bool = True) -> str:
    """``obj``'s cleaned docstring; without its first paragraph if ``summary`` is False."""
    text = inspect.getdoc(obj) or ""
    return text if summary else "\n\n".join(re.split(r"\n\s*\n", text)[1:])


def pattern_function(name: str) -> object:
    """The function that computes pattern ``name``'s per-query score: the surface statistic of that name
    (``next``, ``previous``) or the function of that name in :mod:`bertology.analysis.patterns`."""
    return SURFACE_STATISTICS[name] if name in SURFACE_STATISTICS else getattr(patterns_module, name)


def closest_pairs(distances: HeadDistances, labels: np.ndarray, count: int = CLOSEST_PAIRS) -> pd.DataFrame:
    """The ``count`` pairs of distinct heads with the smallest mean JS divergence, closest first (ties: in
    layer-major order), with both heads' labels."""
    import pandas as pd

    distance = distances.distance
    first, second = np.triu_indices(len(distance), k=1)
    order = np.argsort(distance[first, second], kind="stable")[:count]
    heads = distances.heads
    flat_labels = labels.ravel()
    return pd.DataFrame(
        {
            "rank": np.arange(1, len(order) + 1),
            "head A": [head_name(*heads[first[i]]) for i in order],
            "label A": [flat_labels[first[i]] for i in order],
            "head B": [head_name(*heads[second[i]]) for i in order],
            "label B": [flat_labels[second[i]] for i in order],
            JS_DIVERGENCE: distance[first[order], second[order]],
        }
    )


@dataclass
class Figures:
    """Saves each figure as ``directory/<name>.png`` and returns it as an inline page figure."""

    directory: Path
    dpi: int

    def embed(self, name: str, figure: Figure, *, alt: str, caption: Markup | str) -> Markup:
        png = plots.to_png(figure, dpi=self.dpi)
        (self.directory / f"{name}.png").write_bytes(png)
        return page.figure(png, alt=alt, caption=caption, width=round(figure.get_figwidth() * 96))


def _check_inputs(
    surface: HeadTable,
    patterns: HeadPatterns,
    distances: HeadDistances,
    mds: np.ndarray,
    examples: Mapping[tuple[int, int], str],
) -> None:
    """Refuse results of different shapes and absolute example links, before drawing anything."""
    for href in examples.values():
        page.check_relative(href)
    shape = (surface.num_layers, surface.num_heads)
    found = {
        "pattern labels": patterns.labels.shape,
        "distances": (distances.num_layers, distances.num_heads),
    }
    for what, other in found.items():
        if tuple(other) != shape:
            raise BertologyError(
                f"The {what} are for {other} (layers, heads), the surface statistics for {shape}."
            )
    if mds.shape != (shape[0] * shape[1], 2):
        raise BertologyError(
            f"The head map needs [{shape[0] * shape[1]}, 2] coordinates, not {list(mds.shape)}."
        )


def _header(surface: HeadTable, meta: Mapping[str, str | int | float]) -> list[Markup]:
    layers, heads = surface.num_layers, surface.num_heads
    example = (min(7, layers - 1), min(9, heads - 1))
    numbering = (
        "Heads are numbered (layer, head) from 0 in every table, axis, label and file. Only the "
        '"L-H (paper)" column of the label table uses the 1-based layer-head names of Clark et al. 2019: '
        f"head ({example[0]}, {example[1]}) is {example[0] + 1}-{example[1] + 1} there."
    )
    return [
        page.definitions(
            {
                **{key.replace("_", " "): value for key, value in meta.items()},
                "layers x heads": f"{layers} x {heads}",
            }
        ),
        page.paragraph(numbering, class_="muted"),
        *(
            [page.paragraph(f"Every statistic below is measured on the {WEIGHT_DESCRIPTIONS['norm']}.")]
            if meta.get("weights") == "norm"
            else []
        ),
    ]


def _undefined_note(surface: HeadTable, names: tuple[str, ...]) -> str:
    """A caption sentence naming the statistics with undefined (NaN) heads, or ``""``."""
    undefined = [name for name in names if np.isnan(surface[name]).any()]
    if not undefined:
        return ""
    return (
        " Grey hatched cells are undefined: no segment had a query of that kind for the head "
        f"({', '.join(undefined)}; e.g. [SEP]-to-[SEP] needs a [SEP] query)."
    )


def _defined_anywhere(surface: HeadTable, names: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The statistics of ``names`` some head has a value of, and a caption sentence naming the others
    (``""`` if none): a decoder has no [CLS] or [SEP], an encoder no attention sink."""
    drawn = tuple(name for name in names if np.isfinite(surface[name]).any())
    left_out = [name for name in names if name not in drawn]
    note = f" Not drawn, undefined for every head: {', '.join(left_out)}." if left_out else ""
    return drawn, note


def _statistic_sections(surface: HeadTable, figures: Figures) -> list[Section]:
    drawn, left_out = _defined_anywhere(surface, HEATMAP_STATISTICS)
    heatmaps = figures.embed(
        "surface_heatmaps",
        plots.heatmaps(surface, drawn),
        alt="Layer by head heatmaps of the surface statistics",
        caption="Each head's mean over segments; layers top to bottom, heads left to right, both 0-based; "
        "each panel has its own colour scale, from 0." + _undefined_note(surface, drawn) + left_out,
    )
    summary = figures.embed(
        "layer_summary",
        plots.layer_summary(surface, LAYER_PANELS),
        alt="Per-layer mean attention to [CLS], [SEP] and punctuation",
        caption="Lines: the mean over a layer's heads; faint points: the individual heads.",
    )
    entropy_panels = [pair for pair in ENTROPY_PANELS if np.isfinite(surface[pair[0]]).any()]
    entropy = figures.embed(
        "entropy",
        plots.entropy_by_layer(surface, entropy_panels),
        alt="Per-layer attention entropy of each head with the uniform baseline",
        caption="Faint points: each head's mean entropy; line: the mean over the layer's heads; dashed: the "
        "entropy of uniform attention over the same tokens (cf. Clark et al., Fig. 4).",
    )
    confidence = figures.embed(
        "confidence",
        plots.heatmaps(surface, CONFIDENCE, value_range=(0.0, 1.0)),
        alt="Layer by head heatmaps of the largest attention weight, with [SEP] and with [CLS] and [SEP] "
        "left out",
        caption="Each head's mean largest attention weight, all panels on one scale. Left: every key. "
        "Middle: Voita et al. 2019's confidence, the end-of-sentence token ([SEP]) left out. Right: "
        "bertology's variant, [CLS] and [SEP] left out; heads that attend to [CLS] score far lower here "
        "than in Voita's. Weights are not renormalised." + _undefined_note(surface, CONFIDENCE),
    )
    return [
        Section("Surface statistics", "surface", [heatmaps]),
        Section("Attention by layer", "layers", [summary]),
        Section("Entropy", "entropy", [entropy]),
        Section("Confidence", "confidence", [confidence]),
    ]


def _detectors_section(detectors: Mapping[str, np.ndarray], figures: Figures) -> Section:
    """A decoder's previous-token, duplicate-token and induction scores as heatmaps (the sink, measured
    over the corpus, is among the surface statistics)."""
    table = HeadTable(columns=dict(detectors), defined_segments={}, segments=0)
    definitions = "; ".join(f"{name.replace('_', ' ')}: {SCORE_DESCRIPTIONS[name]}" for name in detectors)
    heatmaps = figures.embed(
        "head_detectors",
        plots.heatmaps(table, tuple(detectors), value_range=(0.0, 1.0), unit="attention mass"),
        alt="Layer by head heatmaps of the previous-token, duplicate-token and induction scores",
        caption=f"Each head's attention mass on the pattern's keys ({definitions}) on seeded repeated random "
        "token sequences, averaged over the queries that have a key of the pattern (TransformerLens's "
        "detection patterns; a perfect head scores 1); all panels on one scale. Every head's scores are in "
        f"{DETECTORS_FILE}; 'bertology heads' draws the strongest heads' views.",
    )
    return Section("Decoder heads", "decoder-heads", [heatmaps])


def _head_map_section(patterns: HeadPatterns, mds: np.ndarray, figures: Figures) -> Section:
    head_map = figures.embed(
        "head_map",
        plots.head_map(mds, patterns.labels),
        alt="Map of the heads by mean Jensen-Shannon divergence, coloured by label",
        caption="Metric MDS of the heads' mean Jensen-Shannon divergences (nats), used as distances as in "
        "Clark et al., Fig. 6: heads that attend alike are close. Colour and marker: primary label; text: "
        "layer-head, 0-based, for the heads whose label would not overlap another.",
    )
    return Section("Map of heads", "head-map", [head_map])


def _label_frame(
    patterns: HeadPatterns, examples: Mapping[tuple[int, int], str], decoder: Mapping[str, np.ndarray]
) -> pd.DataFrame:
    """A row per head: its label, every pattern score and ``decoder``'s scores (a decoder's detector and sink
    scores, by :data:`DECODER_LABELS` name; empty for an encoder), and its example's link."""
    import pandas as pd

    layers, heads = patterns.labels.shape
    layer, head = np.divmod(np.arange(layers * heads), heads)
    scores = {name: values.ravel() for name, values in patterns.scores.columns.items()}
    scores.update({name: decoder[name].ravel() for name in DECODER_LABELS if name in decoder})
    return pd.DataFrame(
        {
            "layer": layer,
            "head": head,
            "L-H (paper)": [f"{lay + 1}-{hd + 1}" for lay, hd in zip(layer, head, strict=True)],
            "label": patterns.labels.ravel(),
            **scores,
            "example": [examples.get((int(lay), int(hd)), "") for lay, hd in zip(layer, head, strict=True)],
        }
    )


def _labels_section(
    patterns: HeadPatterns, examples: Mapping[tuple[int, int], str], decoder: Mapping[str, np.ndarray]
) -> Section:
    frame = _label_frame(patterns, examples, decoder)
    counts = Counter(frame["label"])
    summary = ", ".join(f"{label} {counts[label]}" for label in sorted(counts, key=lambda x: -counts[x]))
    links = [page.link(href, "example") if href else Markup("") for href in frame["example"]]
    return Section(
        "Head labels",
        "labels",
        [
            page.paragraph(f"Primary labels of the {len(frame)} heads: {summary}."),
            page.paragraph(
                "Each head's score for every pattern (a mean over segments; – where undefined) and its "
                "primary label; see the label definitions below. The example shows the head on the segment "
                "where its label pattern scored highest."
                + (
                    " A decoder's detector scores (on repeated random tokens) and sink score come last; a "
                    "head labelled by one of them has no corpus example here."
                    if decoder
                    else ""
                ),
                class_="muted",
            ),
            page.table(frame, markup={"example": links}, id_="label-table"),
        ],
    )


def _pairs_section(distances: HeadDistances, labels: np.ndarray) -> Section:
    intro = docstring(distances_module, summary=False).split("\n\n")[0]
    return Section(
        "Closest head pairs",
        "pairs",
        [
            page.docstring_html(intro),
            page.paragraph(
                f"{JS_DIVERGENCE}: the mean over query tokens of the two heads' Jensen-Shannon divergence "
                "(natural log, so in nats: 0 for identical attention, at most ln 2). It is a divergence, not "
                f"the Jensen-Shannon distance (its square root). {JS_DIVERGENCE_FILE} holds it for every "
                "two heads.",
                class_="muted",
            ),
            page.table(closest_pairs(distances, labels), float_format="{:.4f}", id_="pairs-table"),
        ],
    )


def _label_score(name: str) -> Markup:
    """The definition of label ``name``'s score: its function's docstring, a detector's description."""
    if name == "none":
        return Markup("")
    if name in DETECTORS:
        return page.paragraph(f"{SCORE_DESCRIPTIONS[name]}, on repeated random tokens (Decoder heads above).")
    return page.docstring_html(docstring(pattern_function(name)))


def _label_definitions_section(patterns: HeadPatterns, decoder: bool) -> Section:
    """Every label's meaning, threshold, heads and score; a decoder's labels and their precedence too."""
    import pandas as pd

    names = list(LABEL_DESCRIPTIONS if decoder else PATTERN_DESCRIPTIONS)
    counts = Counter(patterns.labels.ravel())
    detector_limits = DetectorThresholds()  # the thresholds CorpusAnalysis.with_detectors labels with
    frame = pd.DataFrame(
        {
            "label": names,
            "meaning": [LABEL_DESCRIPTIONS[name] for name in names],
            "threshold": [
                getattr(detector_limits if name in DECODER_LABELS else patterns.thresholds, name, None)
                for name in names
            ],
            "heads": [counts[name] for name in names],
            "score": "",
        }
    )
    rules = [label_heads, decoder_labels] if decoder else [label_heads]
    thresholds = [type(patterns.thresholds), DetectorThresholds] if decoder else [type(patterns.thresholds)]
    return Section(
        "Labels and thresholds",
        "label-definitions",
        [
            page.docstring_html(docstring(patterns_module, summary=False)),
            *(page.docstring_html(docstring(rule, summary=False)) for rule in rules),
            *(page.docstring_html(docstring(kind, summary=False)) for kind in thresholds),
            page.table(
                frame,
                float_format="{:g}",
                markup={"score": [_label_score(name) for name in names]},
                id_="label-definitions-table",
            ),
        ],
    )


def _formulas_section(surface: HeadTable, convention: Convention) -> Section:
    import pandas as pd

    statistics = statistics_of(convention)
    names = list(surface.columns)
    frame = pd.DataFrame(
        {
            "statistic": names,
            "shown as": [plots.title_of(name) for name in names],
            "segments": [surface.defined_segments[name] for name in names],
            "definition": "",
        }
    )
    definitions = [page.docstring_html(docstring(statistics[name])) for name in names]
    return Section(
        "Statistic formulas",
        "formulas",
        [
            page.paragraph(
                f"The table below was computed in the '{convention}' convention"
                + (
                    ", which reproduces the numbers of Clark et al.'s released analysis code."
                    if convention == "clark"
                    else " (bertology's own; --convention clark gives the numbers of Clark et al.'s "
                    "released code)."
                )
            ),
            page.docstring_html(docstring(surface_module, summary=False)),
            page.paragraph(
                "Segments: how many segments defined the statistic (had at least one such query).",
                class_="muted",
            ),
            page.table(frame, markup={"definition": definitions}, id_="formulas-table"),
        ],
    )


def write_analysis_report(
    outdir: Path,
    *,
    surface: HeadTable,
    patterns: HeadPatterns,
    distances: HeadDistances,
    mds: np.ndarray,
    examples: Mapping[tuple[int, int], str],
    meta: Mapping[str, str | int | float],
    convention: Convention = "bertology",
    detectors: Mapping[str, np.ndarray] | None = None,
    dpi: int = 144,
) -> Path:
    """Write ``outdir/report.html`` and its figures as ``outdir/plots/*.png``; return the report's path.

    surface: :class:`~bertology.stats.surface.SurfaceAccumulator`'s result. patterns, distances: the
        pattern and distance accumulators' results, for the same model (same layers x heads).
    mds: [layers * heads, 2] head coordinates, layer-major (:func:`~bertology.analysis.mds_embedding`).
    examples: (layer, head) -> relative link to an example page for that head, written by the caller
        next to the report; heads without one get no link. Absolute URLs raise :class:`BertologyError`.
    meta: shown in the header in the given order, "_" in keys as spaces (e.g. model, corpus, segments,
        tokens_cut, seconds); ``meta["model"]`` is also in the title.
    convention: the convention ``surface`` was computed in (:mod:`bertology.stats.surface`); the
        formulas shown are that convention's.
    detectors: a decoder's detector scores (:func:`~bertology.analysis.head_detectors.detector_scores`),
        drawn after the surface statistics and listed with the labels, which are then the decoder's
        (:meth:`~bertology.analysis.analyze.CorpusAnalysis.with_detectors`); ``None`` (an encoder): neither.
    dpi: of the PNGs; the page shows them at 96 pixels per inch of figure, so 144 is sharp on 1.5x screens.

    The report is self-contained (images as data URIs, no script, no external URL) apart from the
    example links.
    """
    _check_inputs(surface, patterns, distances, mds, examples)
    decoder_scores = {} if detectors is None else {**detectors, "sink": surface["sink"]}
    figures = Figures(Path(outdir) / "plots", dpi)
    figures.directory.mkdir(parents=True, exist_ok=True)
    sections = [
        *_statistic_sections(surface, figures),
        *([] if detectors is None else [_detectors_section(detectors, figures)]),
        _head_map_section(patterns, mds, figures),
        _labels_section(patterns, examples, decoder_scores),
        _pairs_section(distances, patterns.labels),
        _label_definitions_section(patterns, detectors is not None),
        _formulas_section(surface, convention),
    ]
    title = f"Attention analysis: {meta['model']}" if "model" in meta else "Attention analysis"
    report = Path(outdir) / REPORT_FILE
    report.write_text(page.render_page(title, sections, header=_header(surface, meta)), encoding="utf-8")
    return report


def _example_views(analysis: CorpusAnalysis, loaded: LoadedModel, target: Path) -> dict[tuple[int, int], str]:
    """Write a head view of each labelled head's best segment into ``target/examples/`` (one page per
    segment and layer, shared by that layer's heads); return each head's relative link."""
    chosen = analysis.patterns.label_segment  # [layers, heads], -1 where the head has no label
    wanted = {int(index) for index in np.unique(chosen) if index >= 0}
    segments = example_segments(analysis, loaded, wanted)
    examples: dict[tuple[int, int], str] = {}
    for (layer, head), index in np.ndenumerate(chosen):
        if index < 0 or int(index) not in segments:
            continue
        name = f"examples/segment{index}_layer{layer}.html"
        if not (target / name).exists():
            segment = segments[int(index)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)  # the analysis reported the cuts
                attention = capture(
                    segment.text_a,
                    segment.text_b,
                    model=loaded,
                    max_length=analysis.max_length,
                    weights=analysis.weights,
                )
            head_view(attention, layer=layer).save(target / name)
        examples[(layer, head)] = name
    return examples


def _head_examples(analysis: CorpusAnalysis, loaded: LoadedModel, target: Path) -> None:
    """Write every head's top ``analysis.examples_per_head`` examples to :data:`EXAMPLES_FILE`
    (:mod:`bertology.analysis.examples`); none for 0 or segments over :data:`EXAMPLE_MAX_TOKENS` tokens."""
    per_head = analysis.examples_per_head
    if per_head == 0 or analysis.max_length > EXAMPLE_MAX_TOKENS:
        return
    _, chosen, _ = chosen_examples(analysis.patterns, per_head)
    segments = example_segments(analysis, loaded, {int(index) for index in np.unique(chosen) if index >= 0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)  # the analysis reported the cuts
        examples = collect_examples(
            analysis.patterns,
            segments,
            loaded,
            per_head=per_head,
            max_length=analysis.max_length,
            weights=analysis.weights,
        )
    examples.save(target / EXAMPLES_FILE)


def write_js_divergence(distances: HeadDistances, path: Path) -> None:
    """Write the mean Jensen-Shannon divergence in nats between every two heads to ``path`` (CSV, rows and
    columns named ``layer-head``)."""
    divergence = distances.to_frame()
    divergence.index = divergence.columns = [head_name(layer, head) for layer, head in divergence.index]
    divergence.rename_axis("layer-head").to_csv(path)


def save_analysis(
    analysis: CorpusAnalysis, loaded: LoadedModel, outdir: str | Path, *, on_progress: Progress | None = None
) -> Path:
    """Write ``heads.csv`` (:meth:`~bertology.analysis.analyze.CorpusAnalysis.heads_frame`),
    :data:`JS_DIVERGENCE_FILE` (the mean Jensen-Shannon divergence in nats between every two heads, rows and
    columns named ``layer-head``), ``summary.json``, a head view of each labelled head's best segment in
    ``examples/``, every head's top examples (:data:`EXAMPLES_FILE`, for ``bertology serve --runs``),
    ``report.html`` with its plots and the folder's mark (:func:`bertology.files.run_files.mark_run`) into
    ``outdir``. ``loaded``: the model analysed, for the examples. on_progress: told each stage of the writing
    (a decoder's head scores, the tables, the heads' top examples, the example views, the plots and page) as
    it starts and ends (:func:`bertology.progress.stage`).

    Returns the path of ``report.html``.
    """
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    if loaded.kind == "decoder":
        with stage(on_progress, "Scoring the decoder's heads"):
            analysis = analysis.with_detectors(_decoder_detectors(loaded, target))
    with stage(on_progress, "Writing the tables"):
        analysis.heads_frame().to_csv(target / HEADS_FILE, index=False)
        write_js_divergence(analysis.distances, target / JS_DIVERGENCE_FILE)
        (target / SUMMARY_FILE).write_text(json.dumps(analysis.summary(), indent=2), encoding="utf-8")
    with stage(on_progress, "Storing each head's top examples"):
        _head_examples(analysis, loaded, target)
    mark_run(target, "analysis", model=analysis.model_name)
    with stage(on_progress, "Drawing the example views"):
        examples = _example_views(analysis, loaded, target)
    with stage(on_progress, "Drawing the plots and the report"):
        return write_analysis_report(
            target,
            surface=analysis.surface,
            patterns=analysis.patterns,
            distances=analysis.distances,
            mds=analysis.mds(),
            examples=examples,
            meta=analysis.summary(),
            convention=analysis.convention,
            detectors=analysis.detectors,
        )


def _decoder_detectors(loaded: LoadedModel, target: Path) -> dict[str, np.ndarray]:
    """A decoder's heads' detector scores (:func:`~bertology.analysis.head_detectors.detector_scores`,
    the default sequences, shorter where the model takes fewer tokens), also written to
    :data:`DETECTORS_FILE`."""
    length = min(REPEATED_LENGTH, (loaded.max_length - 1) // 2)
    scores = detector_scores(loaded, length=length)
    layers, heads = np.indices(scores[DETECTORS[0]].shape).reshape(2, -1)
    frame = {"layer": layers, "head": heads, **{name: values.ravel() for name, values in scores.items()}}
    import pandas as pd

    pd.DataFrame(frame).to_csv(target / DETECTORS_FILE, index=False)
    return scores
