"""The explorer page in real headless Chromium against a live server: clicking a head on the map shows
its statistics and draws its stored examples as head views, with the page's Content-Security-Policy
intact and nothing loaded from outside; without a run chosen it lists the analysis runs beside the corpus
search."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from support.browser import ViewPage, serving
from support.circuit_runs import write_run
from support.run_folders import PER_HEAD, write_analysis

from bertology.analysis.examples import EXAMPLES_FILE, HeadExamples
from bertology.index.token_index import build_index
from bertology.models.loading import LoadedModel
from bertology.report.plots import label_style
from bertology.server import create_app

pytestmark = pytest.mark.browser

WAIT_MS = 30_000


@pytest.fixture(scope="module")
def live(
    default_model: LoadedModel, sample_corpus_head: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    runs = tmp_path_factory.mktemp("explorer_browser")
    write_analysis(sample_corpus_head(12), default_model, runs / "my analysis")
    write_run(runs / "my circuit", model="all-MiniLM-L6-v2", layers=6, heads=12)  # the analysis's model
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
    # beside its statistics, the head's strongest edges in and out of the circuit run of the same model
    ranked = write_run(folder.parent / "my circuit", model="all-MiniLM-L6-v2", layers=6, heads=12)
    rows = "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    shown_in = page.eval_on_selector_all("#circuit-box:not([hidden]) #circuit-in tbody tr", rows)
    shown_out = page.eval_on_selector_all("#circuit-out tbody tr", rows)
    into = [(rank + 1, up) for rank, (up, down, _) in enumerate(ranked) if down.startswith("a4.h7<")][:5]
    out = [(rank + 1, down) for rank, (up, down, _) in enumerate(ranked) if up == "a4.h7"][:5]
    kinds = {"query": "<q>", "key": "<k>", "value": "<v>", "": ""}
    assert [(int(row[3]), row[0]) for row in shown_in] == into
    assert [(int(row[3]), row[0] + kinds[row[1]]) for row in shown_out] == out
    assert page.locator("#grid td.selected").get_attribute("data-layer") == "4"
    assert page.evaluate("document.querySelectorAll('#map circle.near').length") == 5
    frames = page.locator("#examples iframe")
    assert frames.count() == 1  # the first example; the others are drawn when opened
    assert page.locator("#examples details").count() == PER_HEAD
    for rank in range(1, PER_HEAD):
        # Each example is opened with Enter on its focused summary, as a keyboard user opens it. A mouse click
        # aims at coordinates, and the frames above move them: a frame is appended when its example opens, and
        # resized when its page, loaded asynchronously (later under load), reports its height; a click aimed
        # before such a resize lands on another element. Enter opens the summary wherever it is.
        page.press(f"#examples details[data-rank='{rank}'] summary", "Enter")
        opened = page.locator(f"#examples details[data-rank='{rank}'] iframe")
        expect(opened).to_have_count(1, timeout=WAIT_MS)
    expect(frames).to_have_count(PER_HEAD, timeout=WAIT_MS)
    expected = stored.head(4, 7)
    for rank in range(PER_HEAD):
        frame = page.locator(f"#examples details[data-rank='{rank}'] iframe").element_handle().content_frame()
        view = ViewPage(page=frame, url="about:srcdoc")
        view.wait_ready(WAIT_MS)
        data = view.js("JSON.parse(document.getElementById('bertology-data').textContent)")
        assert data["tokens"] == expected[rank].tokens.tokens
        assert (data["layerNames"], data["headNames"]) == (["4"], ["7"])
        assert view.ink() > 0  # lines drawn
    caption = page.locator("#examples summary").first.inner_text()
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


# Every grid cell: its text's width within the cell's content box (nothing cut, nothing spilling over).
CLIPPED_CELLS_JS = """() => [...document.querySelectorAll('#grid td')].filter((cell) => {
  const range = document.createRange();
  range.selectNodeContents(cell);
  const text = range.getBoundingClientRect();
  const box = cell.getBoundingClientRect();
  return cell.scrollWidth > cell.clientWidth || text.left < box.left || text.right > box.right;
}).map((cell) => `${cell.dataset.layer}-${cell.dataset.head}: ${cell.textContent}`)"""

# The map's head names: [x0, y0, x1, y1] of each, in the map's own units.
NAME_BOXES_JS = """() => [...document.querySelectorAll('#map text')].map((text) => {
  const box = text.getBBox();
  return [box.x, box.y, box.x + box.width, box.y + box.height, text.textContent];
})"""


def test_the_overview_is_legible_and_a_clicked_head_comes_into_view(
    chromium_browser: Any, live: tuple[str, Path]
) -> None:
    url, _ = live
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(url + "/explore?run=my%20analysis")
    page.wait_for_selector("body[data-state=idle]", timeout=WAIT_MS)
    labels = page.evaluate("Array.from(document.querySelectorAll('#grid td'), (cell) => cell.textContent)")
    assert set(labels) <= {"piece", "other", "same", "next", "prev", "delim", "broad", "none"}
    assert page.evaluate(CLIPPED_CELLS_JS) == []
    page.select_option("#colour", "entropy")  # numbers in the cells fit as well
    assert page.evaluate(CLIPPED_CELLS_JS) == []
    page.select_option("#colour", "label")

    # the map names heads without hovering: names that overlap neither each other nor leave the map
    boxes = page.evaluate(NAME_BOXES_JS)
    assert len(boxes) >= 20
    assert all(x0 >= 0 and y0 >= 0 and x1 <= 640 and y1 <= 480 for x0, y0, x1, y1, _ in boxes)
    for index, (x0, y0, x1, y1, name) in enumerate(boxes):
        for a0, b0, a1, b1, other in boxes[index + 1 :]:
            assert not (x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1), f"{name} overlaps {other}"

    # the grid's and the map's colours of a label are those the page was given (the report's palette)
    colours = page.evaluate("""() => {
      const td = document.querySelector('#grid td[data-layer="0"][data-head="0"]');
      const dot = document.querySelector('#map circle[data-layer="0"][data-head="0"]');
      return [getComputedStyle(td).backgroundColor, dot.getAttribute('fill'), td.title];
    }""")
    label = colours[2].rsplit(": ", 1)[1]
    hex_colour = label_style(label)[0]
    rgb = f"rgb({int(hex_colour[1:3], 16)}, {int(hex_colour[3:5], 16)}, {int(hex_colour[5:7], 16)})"
    assert colours[:2] == [rgb, hex_colour]

    page.click("#grid td[data-layer='5'][data-head='11']")
    page.wait_for_selector("body[data-state=ready]", timeout=WAIT_MS)
    title = page.locator("#head-title").bounding_box()
    assert title is not None and title["y"] >= 0 and title["y"] + title["height"] <= 900  # in view
    assert page.evaluate("document.documentElement.scrollHeight") < 6000  # one example drawn, not five
    context.close()
