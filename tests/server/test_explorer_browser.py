"""The explorer page in real headless Chromium against a live server: clicking a head on the map shows
its statistics and draws its stored examples as head views, with the page's Content-Security-Policy
intact and nothing loaded from outside; without a run chosen it lists the analysis runs beside the corpus
search."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import ViewPage, serving
from support.run_folders import PER_HEAD, write_analysis

from bertology.analysis.examples import EXAMPLES_FILE, HeadExamples
from bertology.models import LoadedModel
from bertology.server import create_app
from bertology.token_index import build_index

pytestmark = pytest.mark.browser

WAIT_MS = 30_000


@pytest.fixture(scope="module")
def live(
    default_model: LoadedModel, sample_corpus_head: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    runs = tmp_path_factory.mktemp("explorer_browser")
    write_analysis(sample_corpus_head(12), default_model, runs / "my analysis")
    index = build_index(sample_corpus_head(4), runs / "index", model=default_model, layers=[5], threads=1)
    with serving(create_app([default_model], runs=runs, index=index.folder)) as url:
        yield url, runs / "my analysis"


def test_clicking_a_head_on_the_map_draws_its_examples(chromium_browser: Any, live: tuple[str, Path]) -> None:
    url, folder = live
    stored = HeadExamples.load(folder / EXAMPLES_FILE)
    context = chromium_browser.new_context()
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
    page.goto(url + "/")
    page.wait_for_selector("body[data-state=idle]", timeout=WAIT_MS)
    page.click("#runs-list a.explore")
    page.wait_for_selector("body[data-state=idle]", timeout=WAIT_MS)
    assert page.evaluate("document.querySelectorAll('#map circle').length") == 6 * 12
    assert page.evaluate("document.querySelectorAll('#grid td').length") == 6 * 12

    page.click("#map circle[data-layer='4'][data-head='7']")
    page.wait_for_selector("body[data-state=ready]", timeout=WAIT_MS)
    assert page.inner_text("#head-title").startswith("Head 4-7")
    assert page.locator("#grid td.selected").get_attribute("data-layer") == "4"
    assert page.evaluate("document.querySelectorAll('#map circle.near').length") == 5
    frames = page.locator("#examples iframe")
    assert frames.count() == PER_HEAD
    expected = stored.head(4, 7)
    for rank in range(PER_HEAD):
        frame = frames.nth(rank).element_handle().content_frame()
        view = ViewPage(page=frame, url="about:srcdoc")
        view.wait_ready(WAIT_MS)
        data = view.js("JSON.parse(document.getElementById('bertology-data').textContent)")
        assert data["tokens"] == expected[rank].tokens.tokens
        assert (data["layerNames"], data["headNames"]) == (["4"], ["7"])
        assert view.ink() > 0  # lines drawn
    caption = page.locator("#examples figcaption").first.inner_text()
    assert expected[0].tokens.origin in caption

    page.click("#nearest button >> nth=0")  # a nearest head opens in turn
    page.wait_for_selector("body[data-state=ready]", timeout=WAIT_MS)
    assert not page.inner_text("#head-title").startswith("Head 4-7")
    page.select_option("#colour", "entropy")
    assert "entropy" in page.inner_text("#legend")
    assert errors == []
    assert all(request.startswith((url, "about:", "data:")) for request in requests)
    context.close()


def test_without_a_run_the_page_lists_the_analysis_runs_beside_the_search(
    chromium_browser: Any, live: tuple[str, Path]
) -> None:
    url, _ = live
    context = chromium_browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
    page.goto(url + "/explore")
    page.wait_for_selector("body[data-state=idle]", timeout=WAIT_MS)
    page.wait_for_selector("#search:not([hidden])", timeout=WAIT_MS)
    assert page.inner_text("#status") == ""
    assert page.is_hidden("#analysis-view") and page.is_visible("#run-picker")
    links = page.locator("#run-picker-list a")
    assert [links.nth(rank).inner_text() for rank in range(links.count())] == ["my analysis"]
    links.first.click()  # opens that run's explorer page
    page.wait_for_selector("body[data-state=idle]", timeout=WAIT_MS)
    assert page.url == url + "/explore?run=my%20analysis"
    assert page.is_hidden("#run-picker")
    assert page.evaluate("document.querySelectorAll('#map circle').length") == 6 * 12
    assert errors == []
    context.close()
