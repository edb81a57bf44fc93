"""The watch page of a run: its data from a synthetic archive (no model), and the page in real Chromium.

The synthetic run has uniform attention in every head except one, (layer 0, head 1), whose attention
moves from uniform to the next token as the steps go on, so the most changed head is known.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.browser import ViewPage, open_view
from support.run_folders import (
    CHANGED,
    HEADS,
    LAYERS,
    STEPS,
    TOKENS,
    synthetic_attention,
    write_synthetic_run,
)
from support.synthetic_views import HOSTILE_TOKEN

from bertology.errors import BertologyError
from bertology.training.archive import ARCHIVE_FOLDER, ArchiveWriter, ProbeTokens, read_archive
from bertology.training.compare import head_change, js_divergence_rows
from bertology.training.watch import watch_data, watch_html
from bertology.views.payload import unpack


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_run(tmp_path_factory.mktemp("watch") / "run")


def test_js_divergence_of_rows() -> None:
    same = np.array([[0.2, 0.8], [1.0, 0.0]])
    assert np.allclose(js_divergence_rows(same, same), 0.0)
    apart = js_divergence_rows(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert apart == pytest.approx(np.log(2))
    half = js_divergence_rows(np.array([1.0, 0.0]), np.array([0.5, 0.5]))
    expected = 0.5 * np.log(1 / 0.75) + 0.5 * (0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(0.5 / 0.25))
    assert half == pytest.approx(expected)


def test_head_change_is_a_mean_over_all_query_tokens() -> None:
    first = [synthetic_attention(4, 0.0), synthetic_attention(6, 0.0)]
    last = [synthetic_attention(4, 1.0), synthetic_attention(6, 1.0)]
    change = head_change(first, last)
    assert change.shape == (LAYERS, HEADS)
    rows = np.concatenate(
        [js_divergence_rows(a[CHANGED], b[CHANGED]) for a, b in zip(first, last, strict=True)]
    )
    assert change[CHANGED] == pytest.approx(rows.mean())
    assert np.count_nonzero(change) == 1


def test_watch_data_carries_every_step_and_ranks_the_changed_head(synthetic_run: Path) -> None:
    data = watch_data(synthetic_run)
    assert data["view"] == "watch"
    assert data["steps"] == list(STEPS)
    assert [example["tokens"] for example in data["examples"]] == TOKENS
    for example, tokens in zip(data["examples"], TOKENS, strict=True):
        n = len(tokens)
        codes = unpack(example["attention"])  # [T, L, H, n, n] 8-bit
        assert codes.shape == (len(STEPS), LAYERS, HEADS, n, n)
        for record, step in enumerate(STEPS):
            expected = synthetic_attention(n, step / STEPS[-1])
            assert np.abs(codes[record] / 255 - expected).max() <= 1 / 510 + 1e-3
    change = next(section for section in data["sections"] if section["id"] == "change")
    table = change["table"]
    assert table["rows"][0][:3] == [1, *CHANGED]
    assert all(float(row[3]) == 0 for row in table["rows"][1:])
    assert len(table["rows"]) == LAYERS * HEADS
    ids = [section["id"] for section in data["sections"]]
    assert ids == ["training", "statistics", "change"]  # the cut last metrics line is left out
    facts = dict(data["facts"])
    assert facts["final dev accuracy"] == "0.7500 on 4 examples"


def test_watch_needs_an_archive_with_a_record(tmp_path: Path) -> None:
    with pytest.raises(BertologyError, match="no attention monitor archive"):
        watch_html(tmp_path)
    probe = ProbeTokens(["a"], None, None, [["[CLS]", "a", "[SEP]"]], [[0, 0, 0]], [0])
    ArchiveWriter.create(
        tmp_path / ARCHIVE_FOLDER, model="m", layers=1, heads=1, probe=probe, statistics=["x"], every=1
    )
    with pytest.raises(BertologyError, match="has no complete record yet"):
        watch_html(tmp_path)


def test_a_missing_chunk_is_an_error_not_zeros(tmp_path: Path) -> None:
    """Zarr reads a chunk whose file is gone as its fill value (zeros); the archive names the file."""
    run = write_synthetic_run(tmp_path / "run")
    assert read_archive(run).attention(1)[2].sum() > 0
    chunk = run / ARCHIVE_FOLDER / "attention" / "c" / "2" / "1" / "0" / "0" / "0" / "0"
    chunk.unlink()
    with pytest.raises(BertologyError, match=f"is missing {re.escape(str(chunk))}"):
        read_archive(run)
    (run / ARCHIVE_FOLDER / "steps" / "c" / "0").unlink()
    with pytest.raises(BertologyError, match="steps/c/0"):
        watch_html(run)


def test_damaged_files_are_named(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path / "run")
    chunk = run / ARCHIVE_FOLDER / "attention" / "c" / "1" / "0" / "0" / "0" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:20])
    archive = read_archive(run)
    assert archive.attention(1).shape == (3, LAYERS, HEADS, 4, 4)  # the other example reads
    with pytest.raises(
        BertologyError, match=f"{re.escape(str(chunk))} in the attention monitor archive is dam"
    ):
        archive.attention(0)
    (run / "run.json").write_text('{"task": "SY')
    with pytest.raises(BertologyError, match=r"run\.json cannot be read as JSON"):
        watch_html(run)
    (run / "run.json").write_text("[1, 2]")
    with pytest.raises(BertologyError, match=r"run\.json does not hold a JSON object"):
        watch_html(run)


# --- The page in Chromium ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def watch_file(synthetic_run: Path) -> Path:
    path = synthetic_run / "watch.html"
    path.write_text(watch_html(synthetic_run), encoding="utf-8")
    return path


@pytest.fixture
def watch_page(chromium_browser: Any, watch_file: Path) -> Iterator[ViewPage]:
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    yield open_view(context, watch_file)
    context.close()


@pytest.mark.browser
def test_watch_page_paints_and_the_step_slider_redraws(watch_page: ViewPage) -> None:
    view = watch_page
    assert view.js("window.bertology.view") == "watch"
    assert view.state()["watch"] == {"step": 10, "stepIndex": 2, "steps": 3, "example": 0, "mode": "head"}
    assert view.ink() > 500
    last = view.picture()

    view.page.focus("#bt-step")
    view.page.keyboard.press("Home")  # the slider's first position: step 0
    assert view.state()["watch"]["step"] == 0
    assert view.page.text_content("#bt-step-label").startswith("0 ")
    assert view.picture() != last
    view.page.keyboard.press("End")
    assert view.picture() == last  # back at the last step, the same picture

    view.page.select_option("#bt-mode", "model")
    thumb = f'.bt-thumb[data-layer="{CHANGED[0]}"][data-head="{CHANGED[1]}"]'
    other = '.bt-thumb[data-layer="1"][data-head="0"]'
    changed_last, other_last = view.picture(thumb), view.picture(other)
    view.page.focus("#bt-step")
    view.page.keyboard.press("Home")
    assert view.picture(thumb) != changed_last
    assert view.picture(other) == other_last  # an unchanged head looks the same at every step

    view.page.select_option("#bt-example", "1")
    assert view.state()["watch"]["example"] == 1
    assert view.js("document.querySelectorAll('.bt-thumb').length") == LAYERS * HEADS
    view.assert_clean()


@pytest.mark.browser
def test_watch_page_shows_a_hostile_token_as_text_and_loads_nothing(watch_page: ViewPage) -> None:
    view = watch_page
    texts = view.js("[...document.querySelectorAll('.bt-token')].map((node) => node.textContent)")
    assert texts.count(HOSTILE_TOKEN) == 2  # left and right column
    assert view.page.get_by_text(HOSTILE_TOKEN, exact=True).first.is_visible()
    sources = view.js("[...document.images].map((image) => image.src.slice(0, 22))")
    assert sources and set(sources) == {"data:image/png;base64,"}  # the report's figures, nothing else
    assert view.js("document.querySelectorAll('script').length") == 2
    assert view.js("document.querySelectorAll('#bt-report table tbody tr').length") == LAYERS * HEADS
    view.assert_clean()
