"""The head, model and neuron view pages in real headless Chromium, on synthetic data (no model).

Each page is rendered by ``render_page`` into a file and opened over file://. Pictures are compared by
reading canvas pixels back; every test ends by checking that no dialog fired, no script error or CSP
violation happened and nothing was requested from anywhere but the page itself.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.browser import PNG_SIGNATURE, ViewPage, png_size
from support.synthetic_views import HOSTILE_TOKEN, synthetic_view

pytestmark = pytest.mark.browser

LEFT = '.bt-token[data-side="left"][data-index="{}"]'
RIGHT = '.bt-token[data-side="right"][data-index="{}"]'


@pytest.fixture(scope="module")
def model_view_512() -> dict[str, Any]:
    """12 layers x 12 heads x 512 tokens: the size the model view must stay fast at."""
    return synthetic_view("model", n=512, layers=12, heads=12, seed=3)


def assert_hostile_token_is_text(view: ViewPage, minimum: int = 1) -> None:
    texts = view.js("[...document.querySelectorAll('.bt-token')].map((node) => node.textContent)")
    assert texts.count(HOSTILE_TOKEN) >= minimum
    match = view.page.get_by_text(HOSTILE_TOKEN, exact=True)
    assert match.count() >= minimum
    assert match.first.is_visible()
    assert view.page.locator("img").count() == 0
    assert view.js("document.querySelectorAll('script').length") == 2
    assert view.dialogs == []


# --- Head view ----------------------------------------------------------------------------------


def test_head_view_draws_switches_layers_and_filters_by_token(open_page: Callable[..., ViewPage]) -> None:
    view = open_page(synthetic_view("head", n=24, layers=3, heads=4))
    assert view.js("window.bertology.view") == "head"
    assert view.page.locator("#bt-filter").count() == 0  # not a pair
    full = view.ink()
    assert full > 2000
    layer0 = view.picture()

    view.page.select_option("#bt-layer", "1")
    assert view.state()["layer"] == 1
    assert view.picture() != layer0
    full = view.ink()

    # Hover: only that token's lines (its outgoing attention on the left, incoming on the right).
    view.page.hover(LEFT.format(5))
    hovered = view.ink()
    assert 0 < hovered < full / 2
    assert view.page.locator(LEFT.format(5)).get_attribute("class").split().count("bt-active") == 1
    view.move_mouse_away()
    assert view.ink() == full

    # Click: the filter sticks after the mouse leaves; clicking again releases it.
    view.page.click(RIGHT.format(0))
    view.move_mouse_away()
    pinned = view.ink()
    assert 0 < pinned < full
    assert view.state()["pinned"] == {"side": "right", "index": 0}
    view.page.click(RIGHT.format(0))
    view.move_mouse_away()
    assert view.state()["pinned"] is None
    assert view.ink() == full
    view.assert_clean()


def test_head_selector_toggles_and_solos_heads(open_page: Callable[..., ViewPage]) -> None:
    # Faint lines: a line's opacity does not depend on how many heads are shown, so fewer heads, less ink.
    view = open_page({**synthetic_view("head", n=24, layers=2, heads=4), "faintLines": True})
    full = view.ink()
    swatch = '.bt-swatch[data-head="{}"]'
    view.page.click(swatch.format(0))
    assert view.state()["heads"] == [1, 2, 3]
    assert view.page.locator(swatch.format(0)).get_attribute("aria-pressed") == "false"
    assert view.ink() < full
    view.page.dblclick(swatch.format(2))
    assert view.state()["heads"] == [2]
    solo = view.ink()
    assert 0 < solo < full
    view.page.dblclick(swatch.format(2))  # double-click the lone head again: all heads back
    assert view.state()["heads"] == [0, 1, 2, 3]
    assert view.ink() == full
    view.assert_clean()


def test_head_view_pair_filter(open_page: Callable[..., ViewPage]) -> None:
    view = open_page(synthetic_view("head", n=24, layers=2, heads=4, pair=True))
    full, everything = view.ink(), view.picture()
    pictures = {"all": everything}
    for choice in ("AA", "AB", "BA", "BB"):
        view.page.select_option("#bt-filter", choice)
        assert view.state()["filter"] == choice
        assert 0 < view.ink() < full
        pictures[choice] = view.picture()
    assert len(set(pictures.values())) == 5
    view.page.select_option("#bt-filter", "all")
    assert view.picture() == everything
    # Segment B tokens are marked.
    assert view.page.locator(".bt-token.bt-seg-b").count() == 2 * (24 - 24 // 2 - 1)
    view.assert_clean()


def test_theme_toggle_changes_background(open_page: Callable[..., ViewPage]) -> None:
    view = open_page(synthetic_view("head", n=12, layers=1, heads=2))
    background = "getComputedStyle(document.body).backgroundColor"
    light = view.js(background)
    assert view.js("document.documentElement.dataset.theme") == "light"
    view.page.click("#bt-theme")
    assert view.js("document.documentElement.dataset.theme") == "dark"
    assert view.js(background) != light
    assert view.state()["theme"] == "dark"
    view.page.click("#bt-theme")
    assert view.js(background) == light

    dark = open_page(synthetic_view("head", n=12, layers=1, heads=2, theme="dark"), name="dark")
    assert dark.js("document.documentElement.dataset.theme") == "dark"
    assert dark.js(background) != light
    view.assert_clean()
    dark.assert_clean()


def test_head_view_png_and_svg_export(open_page: Callable[..., ViewPage]) -> None:
    view = open_page(synthetic_view("head", n=16, layers=2, heads=3))
    with view.page.expect_download() as download:
        view.page.click("#bt-export-png")
    png = Path(download.value.path()).read_bytes()
    assert download.value.suggested_filename.endswith(".png")
    assert png.startswith(PNG_SIGNATURE)
    width, height = png_size(png)
    assert width > 400 and height > 16 * 18

    with view.page.expect_download() as download:
        view.page.click("#bt-export-svg")
    assert download.value.suggested_filename.endswith(".svg")
    svg = ET.fromstring(Path(download.value.path()).read_bytes())
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.tag == f"{ns}svg"
    assert len(svg.findall(f".//{ns}path")) >= 3
    assert HOSTILE_TOKEN in [node.text for node in svg.iter(f"{ns}title")]
    forbidden = {f"{ns}script", f"{ns}foreignObject", f"{ns}image"}
    assert not [node for node in svg.iter() if node.tag in forbidden]
    view.assert_clean()


@pytest.mark.parametrize("view_name", ["head", "model", "neuron"])
def test_hostile_token_is_shown_as_text_and_nothing_runs(
    open_page: Callable[..., ViewPage], view_name: str
) -> None:
    view = open_page(synthetic_view(view_name, n=12, layers=2, heads=2, pair=view_name == "head"))
    if view_name == "model":
        view.page.click('.bt-thumb[data-layer="1"][data-head="1"]')
    assert_hostile_token_is_text(view, minimum=2)
    view.assert_clean()


def test_head_view_at_512_tokens_keeps_to_its_line_budget(open_page: Callable[..., ViewPage]) -> None:
    """How fast it draws is measured in benchmarks/bench_views.py (redraw and one token's lines)."""
    # Faint lines: every weight of at least 1/255 is a line, far more than the budget.
    view = open_page({**synthetic_view("head", n=512, layers=2, heads=12, seed=1), "faintLines": True})
    assert view.ink() > 10_000
    view.js("window.bertology.setLayer(1)")
    # Too many lines cross the view: the faintest are left out, and the page says so.
    assert "strongest" in view.page.locator("#bt-status").inner_text()
    # One token's lines are few: all drawn.
    view.page.hover(LEFT.format(3))
    assert view.page.locator("#bt-status").inner_text() == ""
    # The canvas covers the rows in view, and follows the scrolling.
    before = view.picture()
    view.js(
        """() => new Promise((done) => {
          document.querySelector(".bt-scroll").scrollTop = 3000;
          requestAnimationFrame(() => requestAnimationFrame(done));
        })"""
    )
    assert view.js("document.getElementById('bt-canvas').height") < 1000
    assert view.picture() != before
    view.assert_clean()


def test_canvases_follow_the_device_pixel_ratio(open_page: Callable[..., ViewPage]) -> None:
    head = open_page(synthetic_view("head", n=12, layers=1, heads=2), scale=2)
    widths = "(selector) => { const c = document.querySelector(selector); return [c.width, c.clientWidth]; }"
    pixels, css = head.js(widths, "#bt-canvas")
    assert pixels == 2 * css
    assert head.ink() > 1000
    model = open_page(synthetic_view("model", n=12, layers=1, heads=2), name="model", scale=2)
    pixels, css = model.js(widths, ".bt-thumb")
    assert pixels == 2 * css
    head.assert_clean()
    model.assert_clean()


# --- Model view ---------------------------------------------------------------------------------


def test_model_view_thumbnails_and_detail(open_page: Callable[..., ViewPage]) -> None:
    view = open_page(synthetic_view("model", n=20, layers=3, heads=4))
    thumbs = view.page.locator(".bt-thumb")
    assert thumbs.count() == 12
    thumb = '.bt-thumb[data-layer="{}"][data-head="{}"]'
    for layer in range(3):
        for head in range(4):
            assert view.ink(thumb.format(layer, head)) > 20
    layer_pictures = [tuple(view.picture(thumb.format(layer, h)) for h in range(4)) for layer in range(3)]
    assert len(set(layer_pictures)) == 3  # every layer looks different

    assert not view.page.locator("#bt-detail").is_visible()
    view.page.click(thumb.format(1, 2))
    assert view.page.locator("#bt-detail").is_visible()
    assert view.state()["detail"]["layer"] == 1 and view.state()["detail"]["head"] == 2
    assert "Layer 1" in view.page.locator("#bt-detail").inner_text()
    full = view.ink("#bt-detail-canvas")
    assert full > 300
    first = view.picture("#bt-detail-canvas")
    view.page.click("#bt-detail " + LEFT.format(4))
    assert 0 < view.ink("#bt-detail-canvas") < full
    png = view.png_from_data_url()  # the enlarged head, as a picture
    assert png.startswith(PNG_SIGNATURE)

    view.page.click("#bt-detail-close")
    assert not view.page.locator("#bt-detail").is_visible()
    view.page.click(thumb.format(2, 0))
    assert view.picture("#bt-detail-canvas") != first
    view.page.keyboard.press("Escape")
    assert not view.page.locator("#bt-detail").is_visible()

    grid_png = view.png_from_data_url()
    assert png_size(grid_png)[0] > 4 * 32
    view.page.click("#bt-theme")
    assert view.picture(thumb.format(0, 0)) != layer_pictures[0][0]  # thumbnails follow the theme
    view.assert_clean()


def test_model_view_at_512_tokens_paints_every_thumbnail(
    open_page: Callable[..., ViewPage], model_view_512: dict[str, Any]
) -> None:
    """How soon it is painted is measured in benchmarks/bench_views.py (target: 5 s)."""
    view = open_page(model_view_512, name="model512", timeout_ms=120_000)  # waits on its ready state
    painted = view.js(
        """() => [...document.querySelectorAll(".bt-thumb")].filter((canvas) => {
          const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
          for (let i = 4; i < data.length; i += 4) {
            if (data[i] !== data[0] || data[i + 2] !== data[2]) return true;
          }
          return false;
        }).length"""
    )
    assert painted == 144
    view.assert_clean()


# --- Neuron view --------------------------------------------------------------------------------


def test_neuron_view_reacts_to_its_controls(open_page: Callable[..., ViewPage]) -> None:
    """The numbers themselves are checked against real models' captured probabilities in
    test_views_models_browser.py; here, that every control changes what is shown."""
    data = synthetic_view("neuron", n=14, layers=3, heads=2, head_dim=16)
    view = open_page(data)
    assert view.ink() > 2000
    state = view.state()
    assert (state["layer"], state["head"], state["query"]) == (0, 0, 3)
    shown_before: list[float] = []

    def check_selection() -> None:
        shown = view.js("window.bertology.neuron()")
        selection = ("layer", "head", "query")
        assert [shown[key] for key in selection] == [view.state()[key] for key in selection]
        assert shown["probs"] != shown_before
        shown_before[:] = shown["probs"]

    check_selection()
    before = view.picture()
    view.page.select_option("#bt-layer", "2")
    after_layer = view.picture()
    assert after_layer != before
    check_selection()

    view.page.select_option("#bt-head", "1")
    assert view.picture() != after_layer
    check_selection()

    view.page.click(LEFT.format(6))
    assert view.state()["query"] == 6
    assert view.page.locator("#bt-query").input_value() == "6"
    assert "bt-active" in view.page.locator(LEFT.format(6)).get_attribute("class")
    check_selection()

    png = view.png_from_data_url()
    assert png_size(png)[1] > 14 * 18
    view.assert_clean()


# --- Robustness ---------------------------------------------------------------------------------


def test_unusable_data_shows_an_error_instead_of_a_picture(open_page: Callable[..., ViewPage]) -> None:
    data = synthetic_view("head", n=10, layers=2, heads=2)
    data["n"] = 11
    data["tokens"].append("extra")
    view = open_page(data, wait=False)
    view.page.wait_for_selector("body[data-ready='error']")
    assert "shape" in view.page.locator(".bt-error").inner_text()
    assert view.foreign_requests() == []


def test_norm_based_weights_are_named_in_the_subtitle(open_page: Callable[..., ViewPage]) -> None:
    data = synthetic_view("model", n=12, layers=2, heads=3, seed=5)
    plain = open_page(data, name="plain")
    assert "norm-based" not in plain.js("document.querySelector('.bt-subtitle').textContent")
    view = open_page({**data, "weights": "norm"}, name="norm")
    assert "norm-based weights" in view.js("document.querySelector('.bt-subtitle').textContent")
    assert view.ink(".bt-thumb") > 0
    view.assert_clean()


def test_the_subtitle_counts_in_the_singular_and_the_plural(open_page: Callable[..., ViewPage]) -> None:
    one = open_page(
        {**synthetic_view("head", n=12, layers=1, heads=1, seed=2), "headNames": ["3"]}, name="one"
    )
    assert "1 layer × 1 column" in one.js("document.querySelector('.bt-subtitle').textContent")
    assert "layers" not in one.js("document.querySelector('.bt-subtitle').textContent")
    two = open_page(synthetic_view("head", n=12, layers=2, heads=3, seed=2), name="two")
    assert "2 layers × 3 heads" in two.js("document.querySelector('.bt-subtitle').textContent")
