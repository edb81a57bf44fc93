"""A 4,096-token input's views in headless Chromium: the head view draws a window of the long input, its
arrows scroll it, a click on the minimap jumps, the layer selector switches to another layer's rows, the
drawn weights equal ``LongAttention.block`` rows, the model view's thumbnails cover the whole input, the
neuron view opens for a late token with the same softmax, and in the web app the window's
full-resolution block arrives from ``POST /api/attention`` whenever the window or the layer changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.browser import ViewPage, serving
from transformers import AutoTokenizer, BertConfig, BertModel

import bertology
from bertology.attention.capturing import capture
from bertology.attention.long_capture import LongAttention
from bertology.models.loading import default_model_path
from bertology.views import head_view, model_view, neuron_view

pytestmark = pytest.mark.browser

TOKENS = 4096
#: 1/510 from the 8-bit codes.
CODE_ERROR = 0.5 / 255 + 1e-6


WORDS = ("the quick brown fox jumps over the lazy dog near the river " * 400).split()
#: A 4,096-token input (one token per word).
LONG_TEXT = " ".join(WORDS[: TOKENS - 2])
#: How long a page of the long input may take to draw (ms): its weights are large to parse.
LONG_PAGE_MS = 30_000


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> bertology.LoadedModel:
    """A random 2-layer BERT (hidden 32, 4 heads) reading 4,096 tokens."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path(), model_max_length=TOKENS)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=TOKENS,
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("long_bert")
    model = BertModel(config)
    with torch.no_grad():  # sharpen the attention: random weights spread it below 1/255 over 4,096 keys
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.mul_(8)
            layer.attention.self.key.weight.mul_(8)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return bertology.load_model(directory)


@pytest.fixture(scope="module")
def long_attention(long_model: bertology.LoadedModel) -> LongAttention:
    """The 4,096-token input of the long model."""
    attention = capture(LONG_TEXT, model=long_model)
    assert isinstance(attention, LongAttention) and len(attention.tokens) == TOKENS
    return attention


def _drawn_row(view: ViewPage, head: int, row: int) -> np.ndarray:
    """The window's attention codes of query ``row`` (index in the window) in ``head``, as the page
    draws them (its weight boxes of the pinned token), divided by 255."""
    view.js(f"window.bertology.setHeads([{head}])")
    view.js(f"window.bertology.focusToken('left', {row})")
    boxes = view.js("window.bertology.weightBoxes()")
    return np.array([weights[0] for weights in boxes["rows"]], dtype=np.float64)


def test_a_long_head_view_scrolls_jumps_and_draws_the_blocks_rows(
    long_attention: LongAttention, open_page: Any
) -> None:
    attention = long_attention
    # Faint lines: the tiny random model's weights are too small for lines at an opacity of weight / heads.
    view = open_page(
        head_view(attention, layer=1, window=(0, 128), faint_lines=True).html, "head", timeout_ms=LONG_PAGE_MS
    )
    assert view.state()["window"] == {"start": 0, "stop": 128, "n": TOKENS}
    assert view.js("window.bertology.firstPaintMs") < 3000
    view.page.click("#bt-window-on")  # scroll on by half a window
    assert view.state()["window"]["start"] == 64
    box = view.page.locator("#bt-minimap").bounding_box()
    view.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.75)
    start = view.state()["window"]["start"]
    assert abs(start + 64 - 0.75 * TOKENS) < TOKENS / 100  # jumped to the clicked place
    assert view.page.locator(".bt-token[data-side='left'][data-index='0']").inner_text() != ""
    assert "of 4096" in view.page.locator("#bt-window-note").inner_text()
    assert view.ink() > 0 and view.ink("#bt-minimap") > 0
    window = attention.block(1, slice(start, start + 128), slice(start, start + 128), heads=[2])[0]
    row = int(window.max(-1).argmax())  # the window row with the strongest weight inside the window
    expected = window[row]
    drawn = _drawn_row(view, 2, row)
    shown = drawn > 0
    assert shown.sum() >= 1
    np.testing.assert_allclose(drawn[shown], expected[shown], atol=CODE_ERROR)
    k = 16  # every weight of the window not drawn is below the row's 16th largest
    kth = np.sort(attention.block(1, slice(start + row, start + row + 1), heads=[2])[0, 0])[-k]
    assert (expected[~shown] <= kth + CODE_ERROR).all()
    view.assert_clean()


def _assert_drawn_rows_equal_the_block(
    view: ViewPage, attention: LongAttention, layer: int, head: int
) -> None:
    """The window row with the strongest weight inside the window, as drawn, equals
    ``LongAttention.block``'s row of ``layer`` where drawn; what is not drawn is below the row's 16th."""
    window = view.state()["window"]
    start, stop = window["start"], window["stop"]
    rows = attention.block(layer, slice(start, stop), slice(start, stop), heads=[head])[0]
    row = int(rows.max(-1).argmax())
    drawn = _drawn_row(view, head, row)
    shown = drawn > 0
    assert shown.sum() >= 1
    np.testing.assert_allclose(drawn[shown], rows[row][shown], atol=CODE_ERROR)
    kth = np.sort(attention.block(layer, slice(start + row, start + row + 1), heads=[head])[0, 0])[-16]
    assert (rows[row][~shown] <= kth + CODE_ERROR).all()


def test_a_long_head_view_switches_layer_and_draws_that_layers_rows(
    long_attention: LongAttention, open_page: Any
) -> None:
    attention = long_attention
    view = open_page(
        head_view(attention, layer=1, window=(1000, 128)).html, "layers", timeout_ms=LONG_PAGE_MS
    )
    assert view.page.locator("#bt-layer option").count() == attention.num_layers
    minimap = view.picture("#bt-minimap")
    view.page.select_option("#bt-layer", "0")
    assert view.state()["layer"] == 0 and view.state()["window"]["start"] == 1000
    assert view.picture("#bt-minimap") != minimap  # layer 0's own minimap
    _assert_drawn_rows_equal_the_block(view, attention, 0, 1)
    view.page.click("#bt-window-back")  # the layer stays when the window moves
    assert view.state()["layer"] == 0 and view.state()["window"]["start"] == 936
    _assert_drawn_rows_equal_the_block(view, attention, 0, 3)
    view.assert_clean()


def test_a_long_model_view_draws_its_window(long_attention: LongAttention, open_page: Any) -> None:
    view = open_page(model_view(long_attention, window=(4000, 64)).html, "model", timeout_ms=LONG_PAGE_MS)
    assert view.page.locator(".bt-subtitle").inner_text().count("64 tokens") == 1
    assert "Thumbnails show all 4096 tokens" in view.page.locator(".bt-hint").first.inner_text()
    assert view.ink(".bt-thumb[data-layer='1'][data-head='2']") > 0
    view.js("window.bertology.openDetail(1, 2)")
    view.assert_clean()


def test_the_neuron_view_opens_for_a_late_token(long_attention: LongAttention, open_page: Any) -> None:
    attention = long_attention
    late = TOKENS - 5
    view = open_page(
        neuron_view(attention, layer=1, head=3, query=late).html, "neuron", timeout_ms=LONG_PAGE_MS
    )
    assert view.state()["query"] == late
    probs = np.array(view.js("Array.from(window.bertology.neuron().probs)"))
    expected = attention.block(1, slice(late, late + 1), heads=[3])[0, 0]
    np.testing.assert_allclose(probs, expected, atol=2e-3)  # float16 queries and keys
    view.assert_clean()


def test_the_neuron_view_of_a_sliding_window_layer_masks_the_keys_outside_it(
    tiny_model_dirs: dict[str, Path], open_page: Any
) -> None:
    loaded = bertology.load_model(tiny_model_dirs["modernbert"])
    text = "Unbelievably, the quick brown fox jumps over the lazy dog near the riverbank again and again."
    attention = capture(text, model=loaded, mode="qk")
    n = len(attention.tokens)
    layer = next(i for i in range(attention.num_layers) if not attention.visible(i, slice(0, 1)).all())
    data_view = neuron_view(attention, layer=layer, head=1, query=n - 3)
    assert data_view.data["long"]["window"] == [4, 4]  # ModernBERT's local_attention=8 of the tiny model
    view = open_page(data_view.html, "window", timeout_ms=LONG_PAGE_MS)
    probs = np.array(view.js("Array.from(window.bertology.neuron().probs)"))
    expected = attention.block(layer, slice(n - 3, n - 2), heads=[1])[0, 0]
    assert (expected[: n - 3 - 4] == 0).all()
    np.testing.assert_allclose(probs, expected, atol=2e-3)  # float16 queries and keys
    view.assert_clean()


def test_the_web_app_draws_the_windows_full_resolution_block(
    long_model: bertology.LoadedModel, long_attention: LongAttention, chromium_browser: Any
) -> None:
    from bertology.server import create_app
    from bertology.server.limits import Limits

    # The server's time limit for a request (30 s by default) is raised: the page's statistics of the long
    # input took longer than that on a loaded machine and were answered with an error (not what this tests).
    app = create_app([long_model], limits=Limits(max_tokens=TOKENS, timeout_s=600))
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    with serving(app) as url:
        try:
            page = context.new_page()
            asked: list[str] = []
            page.on("request", lambda request: asked.append(request.url))
            page.goto(url + "/")
            page.wait_for_selector("body[data-state=idle]", timeout=30_000)
            page.fill("#text", LONG_TEXT)
            page.click("#show")
            frame = page.locator("#view-frame").element_handle().content_frame()
            view = ViewPage(page=frame, url="about:srcdoc")

            def wait_for_block(layer: int) -> None:
                """Until the window's full-resolution block of ``layer`` is drawn (polled: the frame may be
                out of view, where a browser gives no animation frames)."""
                full = f"s.full && s.full.start === s.window.start && s.full.layer === {layer}"
                state = "const b = window.bertology; const s = b && b.ready && b.state()"
                check = f"() => {{ {state}; return s && {full}; }}"
                frame.wait_for_function(check, timeout=60_000, polling=100)

            wait_for_block(0)
            frame.select_option("#bt-layer", "1")  # another layer gets its own block
            wait_for_block(1)
            assert view.state()["window"]["start"] == 0
            # A row whose window holds more drawable weights (code >= 1) than its top-16 over all keys has:
            # the page alone draws only those, the full block every one.
            whole = long_attention.block(1, slice(0, 256))  # [heads, 256, n]
            drawable = np.round(whole[:, :, :256] * 255) > 0
            top = np.argsort(whole, -1)[..., -16:]
            more = drawable.sum(-1) - (top < 256).sum(-1)
            head, row = np.unravel_index(int(more.argmax()), more.shape)
            assert more[head, row] > 0
            drawn = _drawn_row(view, int(head), int(row))
            np.testing.assert_allclose(drawn, whole[head, row, :256], atol=CODE_ERROR)
            assert (drawn > 0).sum() == drawable[head, row].sum()
            frame.click("#bt-window-on")  # the moved window gets its own block
            wait_for_block(1)
            start, stop = view.state()["window"]["start"], view.state()["window"]["stop"]
            assert start == 128 and sum("/api/attention" in url for url in asked) >= 3
            rows = long_attention.block(1, slice(start, stop), slice(start, stop), heads=[2])[0]
            row = int(rows.max(-1).argmax())
            np.testing.assert_allclose(_drawn_row(view, 2, row), rows[row], atol=CODE_ERROR)
            # no computation left running: the statistics shown, or the page's error state (then said here)
            page.wait_for_selector("#stats:not([hidden]), body[data-state=error]", timeout=600_000)
            assert page.get_attribute("body", "data-state") != "error", page.inner_text("#status")
        finally:
            context.close()
