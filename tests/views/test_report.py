"""The analysis report: sections, figures (inline and as files), the label and pair tables, links,
escaping, NaN handling and model shapes; and the generic page shell it is built with."""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.synthetic_batches import random_attention, random_segments

from bertology.analysis import (
    PATTERN_DESCRIPTIONS,
    DistanceAccumulator,
    HeadDistances,
    HeadPatterns,
    PatternAccumulator,
    mds_embedding,
)
from bertology.errors import BertologyError
from bertology.report import page, plots, write_analysis_report
from bertology.report.analysis import HEATMAP_STATISTICS, JS_DIVERGENCE
from bertology.stats import SURFACE_STATISTICS, HeadTable, SurfaceAccumulator
from bertology.stats.surface import CLARK_SURFACE_STATISTICS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SECTIONS = ("surface", "layers", "entropy", "confidence", "head-map", "labels", "pairs")
SECTIONS += ("label-definitions", "formulas")
FIGURES = 5
DPI = 50  # small images keep the tests fast


@dataclass
class Results:
    surface: HeadTable
    patterns: HeadPatterns
    distances: HeadDistances
    mds: np.ndarray

    @property
    def heads(self) -> list[tuple[int, int]]:
        return [
            (layer, head)
            for layer in range(self.surface.num_layers)
            for head in range(self.surface.num_heads)
        ]


def analyse(layers: int, heads: int, *, seed: int = 0) -> Results:
    """Random single texts and pairs through the real accumulators."""
    rng = np.random.default_rng(seed)
    accumulators = SurfaceAccumulator(), PatternAccumulator(), DistanceAccumulator()
    for pairs in (False, True):
        batch = random_attention(random_segments(4, rng, pairs=pairs), layers, heads, rng)
        for accumulator in accumulators:
            accumulator.update(batch)
    surface, patterns, distances = (accumulator.result() for accumulator in accumulators)
    return Results(surface, patterns, distances, mds_embedding(distances.distance))


def example_links(results: Results) -> dict[tuple[int, int], str]:
    """A link for every other head."""
    return {(layer, head): f"examples/head-{layer}-{head}.html" for layer, head in results.heads[::2]}


def write(outdir: Path, results: Results, **overrides: object) -> str:
    arguments: dict[str, object] = {
        "surface": results.surface,
        "patterns": results.patterns,
        "distances": results.distances,
        "mds": results.mds,
        "examples": example_links(results),
        "meta": {"model": "synthetic", "corpus": "random.txt", "segments": 8, "tokens cut": 3, "time": 1.5},
        "dpi": DPI,
        **overrides,
    }
    path = write_analysis_report(outdir, **arguments)  # type: ignore[arg-type]
    assert path == outdir / "report.html"
    return path.read_text(encoding="utf-8")


class Tables(HTMLParser):
    """Rows of every table with an id; each cell is (text, href of its link or None)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[list[str | None]]]] = {}
        self._table: list[list[list[str | None]]] | None = None
        self._cell: list[str | None] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "table" and found.get("id"):
            self._table = self.tables.setdefault(str(found["id"]), [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = ["", None]
            self._table[-1].append(self._cell)
        elif tag == "a" and self._cell is not None:
            self._cell[1] = found.get("href")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell[0] = str(self._cell[0]) + data

    def rows(self, table: str) -> list[dict[str, list[str | None]]]:
        """The body rows of ``table`` keyed by header text."""
        header, *body = self.tables[table]
        names = [str(cell[0]) for cell in header]
        return [dict(zip(names, row, strict=True)) for row in body]


@pytest.fixture(scope="module", params=[(3, 4), (12, 12)], ids=["3x4", "12x12"])
def written(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Results, str]:
    layers, heads = request.param
    results = analyse(layers, heads)
    outdir = tmp_path_factory.mktemp(f"report_{layers}x{heads}")
    return outdir, results, write(outdir, results)


def test_report_has_every_section_and_the_metadata(written: tuple[Path, Results, str]) -> None:
    _, results, text = written
    for section in SECTIONS:
        assert f'<section id="{section}">' in text
        assert f'href="#{section}"' in text  # in the contents
    assert "<title>Attention analysis: synthetic</title>" in text
    for term, value in [("corpus", "random.txt"), ("segments", "8"), ("tokens cut", "3"), ("time", "1.5")]:
        assert f"<dt>{term}</dt><dd>{value}</dd>" in text
    layers, heads = results.surface.num_layers, results.surface.num_heads
    assert f"<dd>{layers} x {heads}</dd>" in text
    assert "numbered (layer, head) from 0" in text and "1-based" in text


def test_every_figure_is_embedded_and_saved_as_png(written: tuple[Path, Results, str]) -> None:
    outdir, _, text = written
    embedded = [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', text)]
    files = sorted((outdir / "plots").glob("*.png"))
    assert text.count("data:image/png") == len(embedded) == len(files) == FIGURES
    for png in files:
        content = png.read_bytes()
        assert content.startswith(PNG_SIGNATURE) and len(content) > 5000, png.name
    assert sorted(embedded) == sorted(png.read_bytes() for png in files)


def test_label_table_lists_every_head_with_label_scores_and_example(
    written: tuple[Path, Results, str],
) -> None:
    _, results, text = written
    rows = Tables(text).rows("label-table")
    links = example_links(results)
    assert len(rows) == len(results.heads)
    for row, (layer, head) in zip(rows, results.heads, strict=True):
        assert (row["layer"][0], row["head"][0]) == (str(layer), str(head))
        assert row["L-H (paper)"][0] == f"{layer + 1}-{head + 1}"
        assert row["label"][0] == results.patterns.labels[layer, head]
        for name, scores in results.patterns.scores.columns.items():
            shown = row[name][0]
            assert shown == page.MISSING if math.isnan(scores[layer, head]) else f"{scores[layer, head]:.3f}"
        assert row["example"][1] == links.get((layer, head))
        assert row["example"][0] == ("example" if (layer, head) in links else "")


def test_links_are_relative_and_nothing_is_loaded(written: tuple[Path, Results, str]) -> None:
    _, _, text = written
    targets = re.findall(r'(?:src|href)="([^"]*)"', text)
    assert targets
    for target in targets:
        assert target.startswith(("data:image/png;base64,", "#", "examples/")), target[:40]
    assert "<script" not in text and "url(" not in text
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', text)
    assert csp is not None
    assert html.unescape(csp.group(1)).startswith(
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    )
    assert "prefers-color-scheme: dark" in text


def test_closest_pairs_are_sorted_and_labelled(written: tuple[Path, Results, str]) -> None:
    _, results, text = written
    rows = Tables(text).rows("pairs-table")
    count = len(results.heads)
    assert len(rows) == min(20, count * (count - 1) // 2)
    shown = [float(str(row[JS_DIVERGENCE][0])) for row in rows]
    assert shown == sorted(shown)
    distance = results.distances.distance
    # the page prints distances to 4 decimals ({:.4f}): half of 1e-4 at most
    assert shown[0] == pytest.approx(distance[~np.eye(count, dtype=bool)].min(), abs=1e-4)
    for row in rows:
        layer, head = map(int, str(row["head A"][0]).split("-"))
        assert row["label A"][0] == results.patterns.labels[layer, head]


def test_definitions_come_from_the_code(written: tuple[Path, Results, str]) -> None:
    _, results, text = written
    tables = Tables(text)
    formulas = {row["statistic"][0]: row for row in tables.rows("formulas-table")}
    assert list(formulas) == list(SURFACE_STATISTICS)
    for name, function in SURFACE_STATISTICS.items():
        formula = re.search(r"``(v\(q\) = .+?)``", function.__doc__ or "")
        assert formula is not None
        assert f"<code>{html.escape(formula.group(1))}</code>" in text, name
        assert formulas[name]["segments"][0] == str(results.surface.defined_segments[name])
    labels = {row["label"][0]: row for row in tables.rows("label-definitions-table")}
    assert list(labels) == list(PATTERN_DESCRIPTIONS)
    for name, description in PATTERN_DESCRIPTIONS.items():
        assert labels[name]["meaning"][0] == description
        threshold = getattr(results.patterns.thresholds, name, None)
        assert labels[name]["threshold"][0] == (page.MISSING if threshold is None else f"{threshold:g}")


def test_hostile_text_is_escaped(tmp_path: Path) -> None:
    hostile = "</title><script>alert(1)</script>"
    results = analyse(3, 4)
    text = write(
        tmp_path, results, meta={"model": hostile, "<b>corpus</b>": '"><img src=x onerror=alert(2)>'}
    )
    assert "<script>" not in text and "<img src=x" not in text and "<b>" not in text
    assert f"<title>Attention analysis: {html.escape(hostile)}</title>" in text
    assert "<dd>&#34;&gt;&lt;img src=x onerror=alert(2)&gt;</dd>" in text


@pytest.mark.parametrize("href", ["https://example.org/head.html", "//example.org/x", "javascript:alert(1)"])
def test_absolute_example_links_are_refused(tmp_path: Path, href: str) -> None:
    with pytest.raises(BertologyError, match="relative"):
        write(tmp_path, analyse(3, 4), examples={(0, 0): href})


def test_undefined_statistics_are_grey_and_noted(tmp_path: Path) -> None:
    results = analyse(3, 4)
    columns = dict(results.surface.columns)
    columns["sep_to_sep"] = np.where(np.eye(3, 4, dtype=bool), np.nan, columns["sep_to_sep"])
    columns["cls_entropy"] = np.full((3, 4), np.nan)  # no [CLS] panel in the entropy figure
    surface = replace(results.surface, columns=columns)
    text = write(tmp_path, results, surface=surface)
    assert "Grey hatched cells are undefined" in text and "(sep_to_sep; e.g." in text
    # a statistic no head has (an encoder's sink, a decoder's [CLS]) gets no panel, only a mention
    assert "Not drawn, undefined for every head: sink, cls_entropy." in text
    assert text.count("data:image/png") == FIGURES


def test_mismatched_shapes_are_refused(tmp_path: Path) -> None:
    results = analyse(3, 4)
    with pytest.raises(BertologyError, match="coordinates"):
        write(tmp_path, results, mds=results.mds[:5])
    with pytest.raises(BertologyError, match="distances"):
        write(tmp_path, results, distances=analyse(2, 4).distances)


def test_heatmaps_cover_the_surface_statistics_but_baselines() -> None:
    assert "previous" in HEATMAP_STATISTICS and "sep_to_sep" in HEATMAP_STATISTICS
    assert "entropy_uniform" not in HEATMAP_STATISTICS and "confidence" not in HEATMAP_STATISTICS


# --- the page shell ------------------------------------------------------------------------------


def test_blocks_escape_text_and_keep_markup() -> None:
    hostile = '<script>alert("x")</script>'
    escaped = html.escape(hostile, quote=False)
    blocks = [
        page.paragraph(hostile, class_="muted"),
        page.heading(hostile),
        page.link("a.html", hostile),
        page.quotation(hostile, hostile),
        page.definitions({hostile: hostile}),
        page.figure(PNG_SIGNATURE, alt=hostile, caption=hostile),
        page.coloured_tokens([(hostile, "color: red", hostile)]),
        page.table(pd.DataFrame({hostile: [hostile]}), caption=hostile),
    ]
    for block in blocks:
        assert isinstance(block, page.Markup)
        assert "<script" not in block and escaped.replace('"', "&#34;") in block, block
    nested = page.paragraph(page.link("b.html", "b") + " & <c>")
    assert nested == '<p><a href="b.html">b</a> &amp; &lt;c&gt;</p>'


def test_docstrings_become_html_with_literals_references_and_code_blocks() -> None:
    text = (
        "Uses ``a < b`` and :func:`~pkg.mod.name`\nwith :class:`pkg.Thing`::\n\n    x = y * 2\n\nSecond <p>."
    )
    rendered = page.docstring_html(text)
    assert "<p>Uses <code>a &lt; b</code> and <code>name</code>\nwith <code>pkg.Thing</code>:</p>" in rendered
    assert "<pre><code>x = y * 2\n</code></pre>" in rendered
    assert "<p>Second &lt;p&gt;.</p>" in rendered and "<p>." not in rendered


def test_clark_convention_report_shows_its_own_formulas(tmp_path: Path) -> None:
    text = write(tmp_path, analyse(3, 4), convention="clark")
    assert "computed in the &#39;clark&#39; convention" in text
    formulas = {row["statistic"][0]: row for row in Tables(text).rows("formulas-table")}
    assert "0.9999" in str(formulas["entropy"]["definition"][0])
    assert "divided by 2" in str(formulas["sep_to_sep"]["definition"][0])
    assert CLARK_SURFACE_STATISTICS["previous"].__doc__ is not None
    assert "all <code>n</code> queries" in text


def test_table_formats_numbers_missing_values_and_markup_cells() -> None:
    frame = pd.DataFrame({"name": ["<a>", "b"], "value": [0.5, np.nan], "count": [1, 2]})
    links = [page.link("b.html", "b"), page.Markup("")]
    markup = page.table(frame, markup={"name": links}, float_format="{:.2f}", id_="t")
    rows = Tables(markup).rows("t")
    assert [row["name"] for row in rows] == [["b", "b.html"], ["", None]]
    assert [row["value"][0] for row in rows] == ["0.50", page.MISSING]
    assert '<td class="num">2</td>' in markup


def test_page_is_a_self_contained_document() -> None:
    section = page.Section("Results & more", "results", [page.paragraph("1 < 2")])
    document = page.render_page(
        "A <title>", [section], header=[page.definitions({"seed": 0, "time": 1.23456})]
    )
    assert document.startswith("<!DOCTYPE html>")
    assert "<title>A &lt;title&gt;</title>" in document
    assert '<a href="#results">Results &amp; more</a>' in document
    assert "<p>1 &lt; 2</p>" in document and "<dd>1.235</dd>" in document


def test_head_map_names_do_not_overlap_and_labelled_heads_come_first() -> None:
    rng = np.random.default_rng(0)
    coordinates = np.concatenate([rng.normal(scale=0.05, size=(40, 2)), rng.normal(size=(32, 2))])
    labels = np.full((6, 12), "none", dtype=object)
    labels[3, 4] = "next"  # head 40: the first point outside the dense cluster
    labels[0, 0] = "broad"  # head 0: inside it
    figure = plots.head_map(coordinates, labels)
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = figure.axes[0]
    names = [text.get_text() for text in ax.texts]
    boxes = [text.get_window_extent(renderer) for text in ax.texts]
    assert 10 < len(names) < 72 and len(set(names)) == len(names)
    assert names[0] == "3-4"  # labelled heads are named before the others (0-0 finds no free spot)
    assert ax.get_title().startswith(f"{len(names)} of 72 heads named")
    for i, first in enumerate(boxes):
        for second in boxes[i + 1 :]:
            assert not first.overlaps(second)


HOSTILE = '</title><script>alert("x")</script><img src=x onerror=alert(1)>'


def assert_inert(text: str) -> None:
    """``HOSTILE`` shows only as text: no tag of it survives, its escaped form is there."""
    assert "<script" not in text and "<img src=x" not in text and "</title><" not in text
    assert "&lt;script&gt;alert(" in text


def test_hostile_text_is_escaped_in_the_other_reports(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from bertology.interventions.saliency import METHODS, Explanation
    from bertology.probes.coreference import CorefProbe
    from bertology.probes.results import CoreferenceResult
    from bertology.report.comparison import views_page
    from bertology.report.interventions import write_explanation
    from bertology.report.probes import write_probe_report

    tokens = ["[CLS]", HOSTILE, "[SEP]"]
    explanation = Explanation(
        text=HOSTILE,
        text_b=HOSTILE,
        tokens=tokens,
        special=np.array([True, False, True]),
        label=HOSTILE,
        probability=0.9,
        attributions={method: np.array([0.0, 0.5, -0.1]) for method in METHODS},
        logit=1.0,
        baseline_logit=0.5,
        steps=8,
    )
    written, _ = write_explanation(explanation, tmp_path / "why.html")
    assert_inert(written.read_text(encoding="utf-8"))

    counts = np.ones(3, dtype=np.int64)
    probe = CorefProbe(
        correct=np.ones((3, 2, 3), dtype=np.int64),
        counts=2 * counts,
        baselines=np.ones((3, 3), dtype=np.int64),
        out_of_reach=counts,
        skipped=counts,
        documents=1,
        windows=1,
    )
    result = CoreferenceResult(
        probe, corpus=HOSTILE, model_name=HOSTILE, head_words=HOSTILE, seconds=0.0, left_out={HOSTILE: 1}
    )
    report = write_probe_report(result, tmp_path / "probe", dpi=DPI)
    assert_inert(report.read_text(encoding="utf-8"))

    view = SimpleNamespace(data={"model": HOSTILE}, html=f"<p>{HOSTILE}</p>")
    page_text = views_page((view, view), caption=HOSTILE)  # type: ignore[arg-type]
    assert_inert(page_text)
    srcdoc = re.findall(r'srcdoc="([^"]*)"', page_text)
    assert srcdoc == [html.escape(view.html).replace("&quot;", "&#34;").replace("&#x27;", "&#39;")] * 2
