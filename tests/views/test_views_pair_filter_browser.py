"""BertViz's "Sentence A -> Sentence B" filter in the model and neuron views of a pair (issue 25, item 8),
in headless Chromium on synthetic data."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from support.browser import ViewPage
from support.synthetic_views import synthetic_view

from bertology.views.payload import pack_attention, unpack

pytestmark = pytest.mark.browser

FILTERS = {"AA": (0, 0), "AB": (0, 1), "BA": (1, 0), "BB": (1, 1)}

# Every thumbnail's pixels as a data URL, in grid order.
THUMBS_JS = "() => [...document.querySelectorAll('.bt-thumb')].map((canvas) => canvas.toDataURL())"


def test_model_view_filter_shows_the_block_of_each_matrix(open_page: Callable[..., ViewPage]) -> None:
    """Each filter draws, in every thumbnail, the block of query rows of one sentence by key columns of
    the other, exactly as a page of that block alone (its rows and columns as query and key tokens)."""
    data = synthetic_view("model", n=16, layers=2, heads=3, pair=True)
    probs = unpack(data["attention"]) / 255
    segments = np.array(data["segments"])
    view = open_page(data)
    assert view.state()["filter"] == "all"
    everything = view.js(THUMBS_JS)
    drawn = {"all": everything}
    for choice, (query, key) in FILTERS.items():
        view.page.select_option("#bt-filter", choice)
        assert view.state()["filter"] == choice
        drawn[choice] = view.js(THUMBS_JS)
        rows, cols = np.flatnonzero(segments == query), np.flatnonzero(segments == key)
        tokens = [data["tokens"][i] for i in rows]
        block = {
            **data,
            "pair": False,
            "n": len(rows),
            "tokens": tokens,
            "segments": [0] * len(rows),
            "keyTokens": [data["tokens"][j] for j in cols],
            "attention": pack_attention(probs[:, :, rows][:, :, :, cols]),
        }
        alone = open_page(block, f"block_{choice}")
        assert alone.js("document.getElementById('bt-filter')") is None
        assert drawn[choice] == alone.js(THUMBS_JS), choice
        alone.assert_clean()
    assert len({tuple(pictures) for pictures in drawn.values()}) == 5
    # The enlarged head keeps the filter: only lines from A to B.
    view.page.select_option("#bt-filter", "AB")
    view.js("window.bertology.openDetail(1, 2)")
    boxes = view.js("window.bertology.focusToken('left', 1) || window.bertology.weightBoxes()")
    hidden = [row[0] is None for row in boxes["rows"]]
    assert hidden == [bool(segment != 1) for segment in segments]
    view.js("window.bertology.closeDetail()")
    view.page.select_option("#bt-filter", "all")
    assert view.js(THUMBS_JS) == everything
    view.assert_clean()


def test_model_view_of_one_text_has_no_filter(open_page: Callable[..., ViewPage]) -> None:
    view = open_page(synthetic_view("model", n=12, layers=1, heads=2))
    assert view.page.locator("#bt-filter").count() == 0
    view.assert_clean()


def test_neuron_view_filter_offers_the_queries_and_draws_the_keys_of_each_sentence(
    open_page: Callable[..., ViewPage],
) -> None:
    data = synthetic_view("neuron", n=14, layers=2, heads=2, head_dim=8, pair=True)
    segments = np.array(data["segments"])
    view = open_page(data)
    view.js("window.bertology.setQuery(10)")  # a token of sentence B
    everything, picture = view.js("window.bertology.neuron()"), view.picture()
    assert everything["shownKeys"] == list(range(14))
    view.page.select_option("#bt-filter", "AB")
    state, shown = view.state(), view.js("window.bertology.neuron()")
    # The query moves to the first token of A, the key rows are B's; the softmax stays the model's (all keys).
    assert (state["filter"], state["query"]) == ("AB", 0)
    assert shown["shownKeys"] == np.flatnonzero(segments == 1).tolist()
    assert view.picture() != picture
    view.js("window.bertology.setQuery(10)")
    view.page.select_option("#bt-filter", "BA")
    shown = view.js("window.bertology.neuron()")
    assert view.state()["query"] == 10 and shown["probs"] == everything["probs"]
    assert shown["shownKeys"] == np.flatnonzero(segments == 0).tolist()
    # Queries of A are not offered: dimmed, not in the selector, and a click leaves the query as it is.
    disabled = view.js("[...document.querySelectorAll('#bt-query option')].map((option) => option.disabled)")
    assert disabled == [bool(segment == 0) for segment in segments]
    view.page.click('.bt-token[data-side="left"][data-index="1"]')
    assert view.state()["query"] == 10
    view.page.select_option("#bt-filter", "all")
    assert view.picture() == picture
    view.assert_clean()
