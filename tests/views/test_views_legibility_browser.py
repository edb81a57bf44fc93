"""Legibility of the view pages in headless Chromium at 1280 x 900: contrast of head colours and their
labels in both themes, per-head weight boxes beside the tokens, faint lines that stay visible, long head,
model and token names that stay in their place, the neuron view's colour scale, and a first picture that
does not wait for an animation frame."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.browser import ViewPage
from support.synthetic_views import synthetic_attention, synthetic_view

from bertology.views.payload import pack_attention, pack_float16, unpack

pytestmark = pytest.mark.browser

LEFT = '.bt-token[data-side="left"][data-index="{}"]'
LINE_AREA = 360  # px between the token columns (views.js LINE_AREA)
ROW = 18  # px per token row (views.js ROW)

# [canvas height, width, RGBA values] of a canvas.
PIXELS_JS = """(selector) => {
  const canvas = document.querySelector(selector);
  const image = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
  return [canvas.height, canvas.width, Array.from(image.data)];
}"""
# [text colour, background colour] of every element matching a selector, as computed.
COLOURS_JS = """(selector) => [...document.querySelectorAll(selector)].map((node) => {
  const style = getComputedStyle(node);
  return [style.color, style.backgroundColor];
})"""


def _rgb(css: str) -> tuple[float, ...]:
    return tuple(float(value) for value in re.findall(r"[\d.]+", css)[:3])


def _contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two CSS rgb() colours."""

    def luminance(css: str) -> float:
        channels = [value / 255 for value in _rgb(css)]
        r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _pixels(view: ViewPage, selector: str = "#bt-canvas") -> np.ndarray:
    height, width, values = view.js(PIXELS_JS, selector)
    return np.array(values, dtype=np.uint8).reshape(height, width, 4)


# --- Head colours ---------------------------------------------------------------------------------


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_swatch_labels_are_readable_in_both_themes(open_page: Callable[..., ViewPage], theme: str) -> None:
    """White on the pastel swatches 10 and 11 was about 1.7:1; each label now takes black or white."""
    view = open_page(synthetic_view("head", n=8, layers=1, heads=20, theme=theme))
    colours = view.js(COLOURS_JS, "#bt-heads .bt-swatch")
    assert len(colours) == 20
    for head, (text, background) in enumerate(colours):
        assert _contrast(text, background) >= 4.5, f"head {head}: {text} on {background}"
    # A head switched off: its label on the page background.
    view.page.click('.bt-swatch[data-head="10"]')
    text, _ = view.js(COLOURS_JS, '.bt-swatch[data-head="10"]')[0]
    page_background = view.js("getComputedStyle(document.body).backgroundColor")
    assert _contrast(text, page_background) >= 4.5
    view.assert_clean()


def test_dark_theme_head_colours_stand_out_from_the_background(open_page: Callable[..., ViewPage]) -> None:
    """On the dark theme the grey head 7 (and blue, red, brown) were below 4.5:1; the lines use the same
    colours as the swatches."""
    view = open_page(synthetic_view("head", n=8, layers=1, heads=20, theme="dark"))
    page_background = view.js("getComputedStyle(document.body).backgroundColor")
    swatches = [background for _, background in view.js(COLOURS_JS, "#bt-heads .bt-swatch")]
    for head, colour in enumerate(swatches):
        assert _contrast(colour, page_background) >= 4.5, f"head {head}: {colour}"
    # Head 7 alone, from token 0: its lines and boxes are drawn in the swatch's colour.
    view.js("window.bertology.setHeads([7])")
    view.js("window.bertology.focusToken('left', 0)")
    pixels = _pixels(view).astype(int)
    grey = np.array(_rgb(swatches[7]))
    drawn = (np.abs(pixels[..., :3] - grey).max(axis=-1) <= 3) & (pixels[..., 3] >= 60)
    assert drawn.sum() > 20
    view.assert_clean()


# --- Weight boxes and faint lines ---------------------------------------------------------------


def test_hovering_a_token_shows_each_heads_weight_in_boxes(open_page: Callable[..., ViewPage]) -> None:
    data = synthetic_view("head", n=12, layers=2, heads=4, pair=True)
    codes = unpack(data["attention"])
    view = open_page(data)
    assert view.js("window.bertology.weightBoxes()") is None
    view.page.hover(LEFT.format(5))
    boxes = view.js("window.bertology.weightBoxes()")
    assert (boxes["side"], boxes["index"], boxes["heads"]) == ("left", 5, [0, 1, 2, 3])
    np.testing.assert_array_equal(np.array(boxes["rows"]), codes[0, :, 5, :].T / 255)

    # The boxes as drawn: beside each key token, one box per head (10 px for 4 heads) at the right end of
    # the lane, the head's colour at an opacity equal to the weight.
    swatches = [_rgb(background) for _, background in view.js(COLOURS_JS, "#bt-heads .bt-swatch")]
    pixels = _pixels(view)
    first_box = LINE_AREA - (4 * 10 + 4) + 4
    for key in range(12):
        for head in range(4):
            x, y = first_box + head * 10 + 4, key * ROW + 3 + 6
            weight = codes[0, head, 5, key] / 255
            assert abs(int(pixels[y, x, 3]) - weight * 255) <= 2, (key, head)
            if weight > 0.5:
                # a colour drawn with alpha over the background and read back as 8-bit pixels: 3 levels
                np.testing.assert_allclose(pixels[y, x, :3], swatches[head], atol=3)

    # Pinned on the right: the boxes sit beside the query tokens and give the weights into that key.
    view.js("window.bertology.focusToken('right', 3)")
    view.move_mouse_away()
    boxes = view.js("window.bertology.weightBoxes()")
    np.testing.assert_array_equal(np.array(boxes["rows"]), codes[0, :, :, 3].T / 255)
    svg = view.js("window.bertology.svgText()")
    assert svg.count("<rect") == 1 + 12 * 4  # the background and every box
    view.assert_clean()


def _line_alphas(view: ViewPage, n: int, keys: list[int], heads: int) -> list[int]:
    """The most opaque pixel (alpha, 0-255) near the middle of the line from query token 0 to each key,
    with token 0 pinned (only its lines drawn; they end where its weight boxes begin)."""
    view.js("window.bertology.focusToken('left', 0)")
    pixels = _pixels(view)
    end = LINE_AREA - (heads * 10 + 4)
    x = end // 2
    alphas = []
    for key in keys:
        y = round((ROW / 2 + (key + 0.5) * ROW) / 2)
        alphas.append(int(pixels[y - 2 : y + 3, x - 2 : x + 3, 3].max()))
    return alphas


def _two_head_lines(n: int = 8) -> dict[str, Any]:
    """Two heads; from token 0, head 0 gives 0.98 to itself and 0.02 to the last token, head 1 all to
    token 3."""
    probs = synthetic_attention(1, 2, n, seed=2)
    probs[0, :, 0] = 0.0
    probs[0, 0, 0, [0, n - 1]] = [0.98, 0.02]
    probs[0, 1, 0, 3] = 1.0
    return {**synthetic_view("head", n=n, layers=1, heads=2), "attention": pack_attention(probs)}


def test_lines_fade_with_their_weight_as_in_bertviz(open_page: Callable[..., ViewPage]) -> None:
    """BertViz draws each line at an opacity of its weight divided by the heads shown: the strong lines
    of the [CLS] / [SEP] patterns stand out and small weights fade (a floor of 0.1 on every line made the
    all-heads view a dense grey mesh)."""
    view = open_page(_two_head_lines())
    strong, weak = _line_alphas(view, 8, [3, 7], heads=2)
    # Weight 1 (the top opacity level, 31/32) over 2 heads: about 0.48, 123 of 255.
    assert 105 <= strong <= 135, strong
    assert weak <= 6, weak  # weight 0.02 / 2 heads: about 1% opacity
    # Head 1 alone: its line at the weight itself.
    view.js("window.bertology.setHeads([1])")
    (alone,) = _line_alphas(view, 8, [3], heads=1)
    assert alone >= 2 * strong - 20, (alone, strong)
    assert view.state()["faintLines"] is False
    view.assert_clean()


def test_faint_lines_are_an_option(open_page: Callable[..., ViewPage]) -> None:
    """faintLines (the "Faint" box): every line at an opacity of at least 0.1, so that a weight of 0.02
    (a typical A -> B line) stays visible."""
    view = open_page({**_two_head_lines(), "faintLines": True})
    assert view.js("document.getElementById('bt-faint').checked") is True
    strong, weak = _line_alphas(view, 8, [3, 7], heads=2)
    assert weak >= 20 and strong >= 200, (weak, strong)
    view.page.click("#bt-faint")  # off: as BertViz
    assert view.state()["faintLines"] is False
    assert _line_alphas(view, 8, [7], heads=2)[0] <= 6
    view.assert_clean()


# --- Long names ---------------------------------------------------------------------------------


def test_long_head_names_stay_in_their_columns(open_page: Callable[..., ViewPage]) -> None:
    names = ["attention (softmax output)", "rollout to the input tokens", "flow to the input tokens"]
    view = open_page({**synthetic_view("model", n=12, layers=2, heads=3), "headNames": names})
    boxes = view.js(
        """() => [...document.querySelectorAll(".bt-col-label")].map((node) => {
          const box = node.getBoundingClientRect();
          return [box.left, box.right, node.title];
        })"""
    )
    thumb = view.js("document.querySelector('.bt-thumb').getBoundingClientRect().width")
    assert [title for _, _, title in boxes] == names
    for (left, right, _), (next_left, _, _) in itertools.pairwise(boxes):
        assert right - left <= thumb + 2 and right <= next_left
    view.assert_clean()


def test_long_model_name_keeps_the_toolbar_on_one_line(open_page: Callable[..., ViewPage]) -> None:
    data = synthetic_view("head", n=12, layers=2, heads=12, pair=True)
    short = open_page(data, "short")
    long_name = "experiments/someone/runs/2024-06-01/sst2-finetuned-all-MiniLM-L6-v2-long-name/model"
    long = open_page({**data, "model": long_name}, "long")
    height = "document.querySelector('.bt-toolbar').getBoundingClientRect().height"
    assert long.js(height) == short.js(height)
    assert long_name in long.js("document.querySelector('.bt-subtitle').title")
    short.assert_clean()
    long.assert_clean()


def test_neuron_view_key_column_fits_at_1280_px(open_page: Callable[..., ViewPage]) -> None:
    """Head size 64, norm-based weights and long tokens: the key token column stayed cut off at the
    right edge of a 1280 px window."""
    data = synthetic_view("neuron", n=14, layers=1, heads=2, head_dim=64)
    data["tokens"] = [
        token if i % 3 else "supercalifragilistic-" * 3 for i, token in enumerate(data["tokens"])
    ]
    norms = np.random.default_rng(0).uniform(0.1, 2, size=(1, 2, 14)).astype(np.float32)
    view = open_page({**data, "weights": "norm", "valueNorms": pack_float16(norms)})
    scroll = view.js(
        "(() => { const s = document.querySelector('.bt-scroll'); return [s.scrollWidth, s.clientWidth]; })()"
    )
    assert scroll[0] <= scroll[1]
    right = view.js(
        "Math.max(...[...document.querySelectorAll('.bt-right .bt-token')]"
        ".map((node) => node.getBoundingClientRect().right))"
    )
    assert right <= 1280
    view.assert_clean()


def test_neuron_view_colour_scale_has_numbers(open_page: Callable[..., ViewPage]) -> None:
    data = synthetic_view("neuron", n=10, layers=2, heads=2, head_dim=16)
    view = open_page(data)
    view.js("window.bertology.setLayer(1); window.bertology.setHead(1); window.bertology.setQuery(4)")
    queries, keys = unpack(data["queries"]).astype(np.float64), unpack(data["keys"]).astype(np.float64)
    vector_scale = max(np.abs(queries[1, 1, 4]).max(), np.abs(keys[1, 1]).max())
    product_scale = np.abs(keys[1, 1] * queries[1, 1, 4]).max()
    values = view.js(
        "[...document.querySelectorAll('#bt-legend .bt-legend-value')].map((n) => n.textContent)"
    )
    expected = [
        f"{sign}{float(f'{scale:.3g}'):g}" for scale in (vector_scale, product_scale) for sign in "\u2212+"
    ]
    assert values == expected
    assert "q, k" in view.js("document.getElementById('bt-legend').textContent")
    view.assert_clean()


# --- First picture ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["head", "model", "neuron"])
def test_page_draws_without_animation_frames(open_page: Callable[..., ViewPage], kind: str) -> None:
    """A frame out of view (a notebook output further down) gets no animation frame; the page must be
    drawn and ready all the same."""
    never = "window.requestAnimationFrame = () => 0;"
    view = open_page(synthetic_view(kind, n=12, layers=2, heads=3), kind, init_script=never)
    selector = ".bt-thumb" if kind == "model" else "#bt-canvas"
    assert view.ink(selector) > 20
    view.assert_clean()
