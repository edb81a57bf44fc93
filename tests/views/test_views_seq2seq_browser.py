"""Encoder-decoder, causal and named-head view pages in headless Chromium.

The encoder-decoder page is built from a real capture of a tiny random BART (source and target of
different lengths, so cross-attention is not square); the named-head page from synthetic data.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.browser import READY, ViewPage
from support.synthetic_views import synthetic_view
from support.tiny_models import save_tiny_model

import bertology
from bertology.attention.seq2seq import Seq2SeqAttention, capture_seq2seq
from bertology.views import seq2seq_view
from bertology.views.build import view_data

pytestmark = pytest.mark.browser

HEAD_NAMES = ["attention", "rollout", "flow"]
LEFT = '.bt-token[data-side="left"]'
RIGHT = '.bt-token[data-side="right"]'
# Pixels [height, width, rgba] of a canvas.
PIXELS_JS = """(selector) => {
  const canvas = document.querySelector(selector);
  const image = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
  return [canvas.height, canvas.width, Array.from(image.data)];
}"""


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("seq2seq_browser_models")


@pytest.fixture(scope="module")
def bart_attention(models_dir: Path) -> Seq2SeqAttention:
    model = bertology.load_model(save_tiny_model("bart", models_dir))
    return capture_seq2seq("I went to the store.", "She bought fresh strawberries at the store.", model=model)


def _texts(view: ViewPage, selector: str) -> list[str]:
    return view.js("(s) => [...document.querySelectorAll(s)].map((node) => node.textContent)", selector)


def test_head_names_replace_numbers_in_both_views(open_page: Callable[..., ViewPage]) -> None:
    model_data = {**synthetic_view("model", n=12, layers=2, heads=3), "headNames": HEAD_NAMES}
    model = open_page(model_data, "model")
    assert _texts(model, ".bt-col-label") == HEAD_NAMES
    model.js("window.bertology.openDetail(1, 2)")
    assert model.js("document.querySelector('#bt-detail h2').textContent") == "Layer 1 · flow"
    model.assert_clean()

    head = open_page({**synthetic_view("head", n=12, layers=2, heads=3), "headNames": HEAD_NAMES}, "head")
    assert _texts(head, "#bt-heads .bt-swatch") == HEAD_NAMES
    head.js("window.bertology.setHeads([1])")
    assert "rollout" in head.js("window.bertology.svgText()")
    head.assert_clean()


def test_head_names_of_the_wrong_length_are_refused(open_page: Callable[..., ViewPage]) -> None:
    data = {**synthetic_view("head", n=12, layers=2, heads=3), "headNames": ["a", "b"]}
    view = open_page(data, wait=False)
    view.page.wait_for_function(READY)
    assert view.js("window.bertology.error") == '"headNames" must list 3 names'


def test_encoder_decoder_head_view_switches_to_cross_attention(
    open_page: Callable[..., ViewPage], bart_attention: Seq2SeqAttention
) -> None:
    source, target = bart_attention.source_tokens, bart_attention.target_tokens
    view = open_page(seq2seq_view(bart_attention, kind="head", attention_set="encoder").data)
    assert view.state()["attentionSet"] == "encoder"
    assert _texts(view, "#bt-attention option") == [
        "Encoder self-attention",
        "Decoder self-attention (causal)",
        "Cross-attention (target \u2192 source)",
    ]
    assert _texts(view, LEFT) == source and _texts(view, RIGHT) == source
    encoder_picture = view.picture()

    view.page.select_option("#bt-attention", "cross")
    assert view.state()["attentionSet"] == "cross"
    assert _texts(view, LEFT) == target and _texts(view, RIGHT) == source
    assert f"{len(target)} query × {len(source)} key tokens" in view.js(
        "document.querySelector('.bt-subtitle').textContent"
    )
    full = view.ink()
    assert full > 500 and view.picture() != encoder_picture
    view.js("(index) => window.bertology.focusToken('right', index)", len(source) - 1)
    into_last_source = view.ink()
    assert 0 < into_last_source < full
    svg = view.js("window.bertology.svgText()")
    assert "into </s>" in svg.replace("&lt;", "<").replace("&gt;", ">")

    view.js("window.bertology.setAttentionSet('decoder')")
    assert _texts(view, RIGHT) == target
    assert "causal" in view.js("document.querySelector('.bt-subtitle').textContent")
    view.assert_clean()


def test_encoder_decoder_model_view_paints_every_set(
    open_page: Callable[..., ViewPage], bart_attention: Seq2SeqAttention
) -> None:
    view = open_page(seq2seq_view(bart_attention, kind="model", layer=1).data)
    assert view.state()["attentionSet"] == "cross"
    for name, layers in (("cross", 2), ("encoder", 3), ("decoder", 2)):
        view.js(f"window.bertology.setAttentionSet('{name}')")
        assert view.js("document.querySelectorAll('.bt-thumb').length") == layers * 4
        assert view.ink('.bt-thumb[data-layer="1"][data-head="0"]') > 0
    view.assert_clean()


def _thumb_pixels(view: ViewPage) -> np.ndarray:
    height, width, values = view.js(PIXELS_JS, '.bt-thumb[data-layer="0"][data-head="0"]')
    return np.array(values, dtype=np.uint8).reshape(height, width, 4)


def test_causal_model_view_hatches_later_keys_only(
    open_page: Callable[..., ViewPage], models_dir: Path
) -> None:
    model = bertology.load_model(save_tiny_model("gpt2", models_dir))
    data = view_data(bertology.capture("The quick brown fox jumps over the lazy dog.", model=model), "model")
    assert data["causal"] is True
    causal = open_page(data, "causal")
    assert "causal" in causal.js("document.querySelector('.bt-subtitle').textContent")
    plain = open_page({key: value for key, value in data.items() if key != "causal"}, "plain")
    hatched, unhatched = _thumb_pixels(causal), _thumb_pixels(plain)
    size, n = hatched.shape[0], data["n"]
    y, x = np.mgrid[0:size, 0:size]
    margin = 2 * size / n  # pixels of two tokens: clear of the cells that pool the diagonal
    above, below = x > y + margin, y > x + margin
    assert (hatched[below] == unhatched[below]).all()  # attendable cells: the same heat colours
    differs = (hatched[above] != unhatched[above]).any(axis=-1)
    assert differs.all()  # later keys: hatched stripes instead of the empty-cell colour
    assert len({tuple(pixel) for pixel in hatched[above]}) == 2  # exactly the two stripe colours
    causal.assert_clean()
    plain.assert_clean()
