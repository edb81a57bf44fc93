"""The comparison report and its side-by-side views page in real headless Chromium.

The report must show its figures with no script and no request beyond the page; the views page must
paint both models' head views inside its sandboxed frames (their script allowed by hash only).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import ViewPage

from bertology.analysis.comparison import compare_models, first_segment
from bertology.analysis.settings import AnalysisSettings
from bertology.corpus.segments import sample_corpus
from bertology.models.loading import LoadedModel
from bertology.report.comparison import write_comparison_report
from bertology.views import head_view

pytestmark = pytest.mark.browser

EXAMPLES = sample_corpus()


@pytest.fixture(scope="module")
def report(default_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A comparison of the default model with itself on the first two segments of the example corpus."""
    comparison = compare_models(default_model, default_model, EXAMPLES, AnalysisSettings(limit=2))
    segment = first_segment(EXAMPLES, default_model)
    view = head_view(segment.text_a, segment.text_b, model=default_model)
    outdir = tmp_path_factory.mktemp("comparison")
    return write_comparison_report(comparison, outdir, views=(view, view), input_text=str(segment.text_a))


@pytest.fixture
def browser_page(chromium_browser: Any) -> Iterator[tuple[Any, list[str], list[str]]]:
    """A page in a fresh context, with the URLs it requested and its errors (script, CSP, console)."""
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    yield page, requests, errors
    context.close()


def test_report_and_side_by_side_views(report: Path, browser_page: tuple[Any, list[str], list[str]]) -> None:
    page, requests, errors = browser_page
    page.goto(report.as_uri())
    headings = page.locator("h2").all_inner_texts()
    assert {
        "Most changed heads",
        "Head matching",
        "Statistics side by side",
        "One input in both models",
    } <= set(headings)
    images = page.evaluate("[...document.images].map((image) => [image.complete, image.naturalWidth])")
    assert len(images) >= 30 and all(complete and width > 100 for complete, width in images)
    assert page.locator("#matching-table tbody tr").count() == 72
    assert page.evaluate("document.scripts.length") == 0

    page.click("text=Open the two head views side by side")
    page.wait_for_url("**/views.html")
    frames = [page.frame_locator(f"#view-{side}") for side in ("a", "b")]
    for frame in frames:
        frame.locator("#bt-canvas").wait_for()
    children = [frame for frame in page.frames if frame != page.main_frame]
    assert len(children) == 2
    for child in children:
        view = ViewPage(page=child, url="about:srcdoc")
        view.wait_ready(timeout_ms=15_000)
        assert view.js("window.bertology.view") == "head"
        assert view.ink() > 2000  # the attention lines are painted

    assert errors == []
    local = (report.as_uri(), (report.parent / "views.html").as_uri())
    assert [url for url in requests if url not in local and not url.startswith(("data:", "about:"))] == []
