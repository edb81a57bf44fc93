"""The patching report's layer x head heatmap in headless Chromium, built from a patching run of the tiny
Llama: hovering (or focusing) a cell shows its head and effect, a click shows that head's attention on the
clean and the corrupted input, tokens as text, one head's at a time; the page has no script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.tiny_models import tiny_language_model

from bertology.interventions.patching import PatchingStudy, patch
from bertology.interventions.patching_pairs import PatchPair
from bertology.report.patching import write_patching_report
from bertology.views.bertviz import prettify

CLEAN, CORRUPTED = "The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"
PAIR = PatchPair(CLEAN, CORRUPTED, " the", " dog", None, None, 1)


@pytest.fixture(scope="module")
def report(
    tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[PatchingStudy, Path]:
    study = patch(tiny_language_model(tiny_model_dirs["llama"]), [PAIR], method="both")
    return study, write_patching_report(study, tmp_path_factory.mktemp("report"))


@pytest.mark.browser
def test_a_cell_shows_its_head_on_hover_and_its_attention_on_a_click(
    chromium_browser: Any, report: tuple[PatchingStudy, Path]
) -> None:
    study, path = report
    assert study.exact is not None
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    exact_grid = page.locator(".head-grid").first
    cell = exact_grid.locator("a[href='#head-1-2']")
    value = f"{study.exact.effect[1, 2]:+.3f}"
    tip = cell.get_by_role("tooltip")
    assert cell.inner_text().startswith(value) and not tip.is_visible()
    cell.hover()
    assert tip.is_visible() and tip.inner_text() == f"1-2: {value}"
    exact_grid.locator("a[href='#head-0-3']").focus()  # a keyboard user's tip: the focused cell's
    assert exact_grid.locator("a[href='#head-0-3']").get_by_role("tooltip").is_visible()

    panel = page.locator("#head-1-2")
    assert not panel.is_visible()
    cell.click()
    assert panel.is_visible() and panel.locator("h3").inner_text().startswith(f"Head 1-2 (effect {value})")
    for index, (run, tokens) in enumerate(zip(("clean", "corrupted"), study.tokens[0], strict=True)):
        matrix = panel.locator("table").nth(index)
        assert matrix.locator("caption").inner_text() == run
        # the query tokens down the side as text, one row of shaded cells per query
        assert matrix.locator("tbody th").all_text_contents() == [prettify(token) for token in tokens]
        assert matrix.locator("tbody td").count() == len(tokens) ** 2
    assert "fox" in panel.locator("table").nth(0).inner_text() and "dog" in panel.inner_text()
    # the attribution grid's cells open the same panels, one head's at a time, over the page: the grid
    # clicked stays where it was, the panel in view
    second = page.locator(".head-grid").nth(1)
    second.scroll_into_view_if_needed()
    where = page.evaluate("window.scrollY")
    second.locator("a[href='#head-0-1']").click()
    other = page.locator("#head-0-1")
    assert other.is_visible() and not panel.is_visible()
    assert page.evaluate("window.scrollY") == where and second.locator("a[href='#head-0-1']").is_visible()
    box = other.bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 900
    other.locator("a.close").click()
    assert not other.is_visible() and page.evaluate("window.scrollY") == where
    assert page.locator("script").count() == 0 and errors == []
    context.close()
