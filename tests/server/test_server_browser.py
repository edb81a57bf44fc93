"""The web app in real headless Chromium against a live uvicorn server on 127.0.0.1 (a free port):
typing a sentence paints the view and the statistics, switching view and layer works, hostile text stays
text, and the page breaks no rule of its Content-Security-Policy."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError
from support.browser import ViewPage, serving

from bertology.models.loading import LoadedModel
from bertology.server import create_app

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=alert(1)>"
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def live_url(
    default_model: LoadedModel, tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    runs = tmp_path_factory.mktemp("browser_runs")
    (runs / "deps").mkdir()
    (runs / "deps" / "report.html").write_text("<!DOCTYPE html><title>Dependency probe</title><h1>Deps</h1>")
    (runs / "sst2").mkdir()  # a fine-tuned run, as `bertology finetune` writes it
    (runs / "sst2" / "run.json").write_text('{"steps": 3}')
    shutil.copytree(tiny_model_dirs["bert"], runs / "sst2" / "model")
    with serving(create_app([default_model], runs=runs)) as url:
        yield url


class AppPage:
    """The app's page in a browser tab, with everything it asked for and every dialog and error."""

    def __init__(self, context: Any, url: str) -> None:
        self.url = url
        self.page = context.new_page()
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.on(
            "console", lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}")
        )
        self.page.goto(url + "/")
        self.page.wait_for_selector("body[data-state=idle]", timeout=WAIT_MS)

    def show(self, text: str) -> None:
        self.page.fill("#text", text)
        self.page.click("#show")
        self.page.wait_for_selector("body[data-state=ready]", timeout=WAIT_MS)
        self.page.wait_for_selector("#stats:not([hidden])", timeout=WAIT_MS)

    def view(self, condition: str) -> ViewPage:
        """The view in the iframe, once ``condition`` (JavaScript over ``b = window.bertology``) holds."""
        check = f"() => {{ const b = window.bertology; return b && b.ready && ({condition}); }}"
        for _ in range(20):  # the page may replace the iframe's document while we look: look again
            frame = self.page.locator("#view-frame").element_handle().content_frame()
            try:
                frame.wait_for_function(check, timeout=WAIT_MS)
                break
            except PlaywrightError as error:
                if "context was destroyed" not in str(error) and "detached" not in str(error):
                    raise
        view = ViewPage(page=frame, url="about:srcdoc")
        view.wait_ready(WAIT_MS)
        return view

    def assert_clean(self, refused: int | None = None) -> None:
        """No dialog, no script error or CSP violation (console errors), no request elsewhere; with
        ``refused``, the only errors are the browser's notes of answers with that status."""
        assert self.dialogs == []
        note = f"console: Failed to load resource: the server responded with a status of {refused}"
        assert [error for error in self.errors if refused is None or not error.startswith(note)] == []
        assert [
            url for url in self.requests if not url.startswith((self.url, "about:", "data:", "blob:"))
        ] == []


@pytest.fixture
def app_page(chromium_browser: Any, live_url: str) -> Iterator[AppPage]:
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    yield AppPage(context, live_url)
    context.close()


def test_type_a_sentence_and_switch_view_and_layer(app_page: AppPage) -> None:
    page = app_page.page
    assert page.locator("#model option").all_inner_texts() == [
        "all-MiniLM-L6-v2 (6 layers × 12 heads)",
        "runs/sst2 (3 layers × 4 heads)",
    ]
    assert page.locator("#runs-list a").all_inner_texts() == ["deps", "sst2"]
    app_page.show("The cat sat on the mat because it was warm.")

    head = app_page.view("b.view === 'head'")
    assert head.state()["layer"] == 0
    assert head.ink() > 2000
    layer0 = head.picture()
    tokens = head.js("[...document.querySelectorAll('.bt-token[data-side=left]')].map((t) => t.textContent)")
    assert tokens[:4] == ["[CLS]", "the", "cat", "sat"]
    # The statistics of this input: a layers x heads table and the tokens, as text.
    assert page.locator("#stat-table tbody tr").count() == 6
    assert page.locator("#stat-table thead th").count() == 13
    assert page.locator("#tokens li").all_inner_texts()[:3] == ["[CLS]", "the", "cat"]
    # "next" and "previous" read apart: attention to the next token, and the label next (the next word)
    options = page.locator("#statistic option").all_inner_texts()
    assert [text for text in options if "next" in text] == [
        "next: attention to the next token",
        "score of the label next (next word)",
    ]
    assert [text for text in options if "previous" in text] == [
        "previous: attention to the previous token",
        "score of the label previous (previous word)",
    ]
    page.select_option("#statistic", "labels:label")
    assert set(page.locator("#stat-table tbody td").all_inner_texts()) <= {
        "next", "previous", "same_word", "other_sentence", "word_pieces", "delimiters", "broad", "none",
    }  # fmt: skip

    page.select_option("#view", "model")
    model = app_page.view("b.view === 'model'")
    assert model.js("document.querySelectorAll('.bt-thumb').length") == 72
    assert model.ink('.bt-thumb[data-layer="5"][data-head="11"]') > 20

    page.select_option("#view", "head")
    page.select_option("#layer", "3")
    head = app_page.view("b.view === 'head' && b.state().layer === 3")
    assert head.picture() != layer0
    assert head.ink() > 2000

    page.select_option("#view", "neuron")
    page.select_option("#head", "5")
    neuron = app_page.view("b.view === 'neuron'")
    assert (neuron.state()["layer"], neuron.state()["head"]) == (3, 5)
    # One selector on the page is called Layer, the view's own; the page's says what it does.
    assert neuron.js("document.getElementById('bt-layer').closest('label').firstChild.textContent") == "Layer"
    page_labels = page.evaluate(
        "[...document.querySelectorAll('label')].map((l) => l.firstChild.textContent.trim())"
    )
    assert "Layer" not in page_labels and "Open at layer" in page_labels
    app_page.assert_clean()


def test_a_fine_tuned_run_is_a_model_of_the_page(app_page: AppPage) -> None:
    page = app_page.page
    page.select_option("#model", "runs/sst2")
    assert page.locator("#layer option").all_inner_texts() == ["0", "1", "2"]
    app_page.show("The cat sat on the mat.")
    assert page.locator("#shown-model").inner_text() == "runs/sst2"
    assert page.locator("#stat-table tbody tr").count() == 3  # its layers
    assert page.locator("#stat-table thead th").count() == 5  # a corner and its 4 heads
    head = app_page.view("b.view === 'head'")
    assert head.ink() > 500
    app_page.assert_clean()


def test_hostile_text_stays_text(app_page: AppPage) -> None:
    page = app_page.page
    app_page.show(HOSTILE)
    assert page.locator("#shown-text").text_content() == HOSTILE
    assert page.get_by_text(HOSTILE, exact=True).is_visible()
    assert "<" in page.locator("#tokens li").all_inner_texts()
    view = app_page.view("b.view === 'head'")
    tokens = view.js("[...document.querySelectorAll('.bt-token[data-side=left]')].map((t) => t.textContent)")
    assert tokens == page.locator("#tokens li").all_inner_texts()
    assert "".join(token.removeprefix("##") for token in tokens[1:-1]) == HOSTILE.replace(" ", "")
    assert page.locator("img").count() == 0
    assert view.js("document.querySelectorAll('img').length") == 0
    page.wait_for_timeout(300)  # time for an onerror handler, were there an image
    app_page.assert_clean()


def test_a_bad_input_shows_the_servers_message(app_page: AppPage) -> None:
    app_page.page.fill("#text", "   ")
    app_page.page.click("#show")
    app_page.page.wait_for_selector("body[data-state=error]", timeout=WAIT_MS)
    assert "empty or only whitespace" in app_page.page.locator("#status").inner_text()
    assert app_page.errors  # the browser noted the 422 answers
    app_page.assert_clean(refused=422)


def test_a_run_opens_from_the_list(app_page: AppPage, chromium_browser: Any) -> None:
    with app_page.page.expect_popup() as popup:
        app_page.page.click("#runs-list a")
    report = popup.value
    report.wait_for_load_state()
    assert report.url.endswith("/runs/deps/report.html")
    assert report.frame_locator("iframe[sandbox='allow-scripts']").locator("h1").inner_text() == "Deps"
