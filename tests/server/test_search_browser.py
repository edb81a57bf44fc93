"""Corpus search on the explorer page in real headless Chromium against a live server: type an input,
click one of its tokens, and its nearest corpus tokens are listed with their contexts, which are the
corpus's own sentences, and their parts of speech; a word search's hit, clicked, becomes the query."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conllu
import pytest
from playwright.sync_api import expect
from support.browser import serving

from bertology.index.token_index import build_index
from bertology.models.loading import LoadedModel
from bertology.server import create_app

pytestmark = pytest.mark.browser

WAIT_MS = 30_000
UPOS = {
    "ADJ",
    "ADP",
    "ADV",
    "AUX",
    "CCONJ",
    "DET",
    "INTJ",
    "NOUN",
    "NUM",
    "PART",
    "PRON",
    "PROPN",
    "PUNCT",
} | {"SCONJ", "SYM", "VERB", "X"}
SENTENCES = 150


@pytest.fixture(scope="module")
def live(
    default_model: LoadedModel, shared_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("search_browser")
    text = (shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu").read_text(encoding="utf-8")
    corpus = folder / "ewt-head.conllu"
    corpus.write_text("\n\n".join(text.split("\n\n")[:SENTENCES]) + "\n\n", encoding="utf-8")
    build_index(corpus, folder / "index", model=default_model, layers=[2, 5], threads=1)
    with serving(create_app([default_model], index=folder / "index")) as url:
        yield url, corpus


def test_clicking_a_token_lists_corpus_neighbours_in_their_context(
    chromium_browser: Any, live: tuple[str, Path]
) -> None:
    url, corpus = live
    sentences = {
        " ".join(token["form"] for token in sentence if isinstance(token["id"], int))
        for sentence in conllu.parse(corpus.read_text(encoding="utf-8"))
    }
    context = chromium_browser.new_context()
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.goto(url + "/explore")
    page.wait_for_selector("#search:not([hidden])", timeout=WAIT_MS)
    assert page.input_value("#search-layer") == "5"
    page.fill("#search-text", "I would like to book a table for dinner.")
    page.click("#search-form button[type=submit]")
    page.wait_for_selector("#search-tokens button", timeout=WAIT_MS)
    buttons = page.locator("#search-tokens button")
    assert buttons.nth(0).inner_text() == "[CLS]"
    assert buttons.nth(5).inner_text() == "book"
    buttons.nth(5).click()
    page.wait_for_selector("#neighbours li", timeout=WAIT_MS)
    items = page.locator("#neighbours li")
    assert items.count() == 10
    contexts = [items.nth(rank).locator(".context").inner_text() for rank in range(10)]
    assert all(text in sentences for text in contexts)  # each context is a corpus sentence, word for word
    assert page.locator("#relation-histogram tr").count() >= 1
    tags = [page.locator("#pos-histogram tr").nth(rank).locator("td").first.inner_text() for rank in range(2)]
    assert set(tags) <= UPOS | {"none"} and tags[0] != "none"
    assert any(f" · {tag} · " in items.nth(rank).inner_text() for rank in range(10) for tag in UPOS)

    # a word search's hit, clicked: its own nearest corpus tokens, itself among them at similarity 1
    page.fill("#search-word", "weapons")
    page.click("#word-form button[type=submit]")
    expect(items.first).not_to_contain_text("similarity", timeout=WAIT_MS)
    assert items.count() == 9  # its occurrences in the corpus
    hit = items.nth(3)
    hit_context, hit_word = hit.locator(".context").inner_text(), hit.locator("mark").inner_text()
    assert hit_word.lower() == "weapons"
    hit.locator(".corpus-token").click()
    expect(items.first).to_contain_text("similarity", timeout=WAIT_MS)
    assert "weapons" in page.inner_text("#search-query")
    assert items.count() == 10
    found = [
        (items.nth(rank).locator(".context").inner_text(), items.nth(rank).locator("mark").inner_text())
        for rank in range(10)
    ]
    assert (hit_context, hit_word) in found
    assert all(request.startswith(url) for request in requests), "the page loaded something from outside"
    assert not errors
    context.close()
