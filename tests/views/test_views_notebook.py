"""Views in a notebook: the output frame sized to its content, drawn even out of view, and a
``load_model()`` that prints no progress bars.

A notebook output is ``View._repr_html_()`` placed in a host page, opened in headless Chromium.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import READY
from support.synthetic_views import synthetic_view
from transformers.utils import logging as transformers_logging

import bertology
from bertology.models.loading import _quiet_weight_loading
from bertology.views import MAX_FRAME_HEIGHT, View

FRAME_HEIGHT_JS = "document.querySelector('iframe').getBoundingClientRect().height"
# Inside the frame: [scrollHeight, clientHeight] of the scrolling area and the bottom of its content.
INNER_JS = """() => {
  const scroll = document.querySelector(".bt-scroll");
  const content = scroll.firstElementChild.getBoundingClientRect().bottom;
  return [scroll.scrollHeight, scroll.clientHeight, content, window.innerHeight];
}"""


@pytest.fixture
def notebook(chromium_browser: Any, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """notebook(view, spacer=0, width=900) -> (page, frame): the view's output, `width` px wide, below
    `spacer` px of other output."""
    contexts = []

    def open_output(view: View, spacer: int = 0, width: int = 900) -> tuple[Any, Any]:
        context = chromium_browser.new_context(viewport={"width": 1000, "height": 800})
        contexts.append(context)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        host = tmp_path / "notebook.html"
        host.write_text(
            f'<!DOCTYPE html><html><body style="margin:0"><div style="width:{width}px">'
            f'<div style="height:{spacer}px">other output</div>{view._repr_html_()}</div></body></html>',
            encoding="utf-8",
        )
        page.goto(host.as_uri())
        frame = page.frames[1]
        # polled by a timer: Playwright's default polls on animation frames, which a frame out of view
        # never gets (the output below a spacer), so readiness after the loader's inflation went unseen
        frame.wait_for_function(READY, polling=100, timeout=10_000)
        assert frame.evaluate("window.bertology.error") is None
        assert errors == []
        return page, frame

    yield open_output
    for context in contexts:
        context.close()


def _settled_height(page: Any, frame: Any) -> float:
    """The frame's height once it has taken the height its page reported (within 15 s: slow under load)."""
    deadline = time.monotonic() + 15
    while True:
        scroll_height, client_height, _, _ = frame.evaluate(INNER_JS)
        if scroll_height <= client_height or time.monotonic() > deadline:
            return page.evaluate(FRAME_HEIGHT_JS)
        time.sleep(0.05)


def test_frame_grows_to_a_twelve_layer_model_view(notebook: Callable[..., Any]) -> None:
    """The frame was 640 px tall whatever it showed, so 12 layers scrolled inside the notebook."""
    page, frame = notebook(View("model", synthetic_view("model", n=30, layers=12, heads=12)))
    height = _settled_height(page, frame)
    scroll_height, client_height, content_bottom, inner_height = frame.evaluate(INNER_JS)
    assert scroll_height <= client_height  # nothing scrolls inside the frame
    assert 640 < height <= MAX_FRAME_HEIGHT
    assert inner_height - content_bottom < 30  # and it has no empty space below the grid


def test_frame_shrinks_to_a_short_head_view(notebook: Callable[..., Any]) -> None:
    page, frame = notebook(View("head", synthetic_view("head", n=6, layers=1, heads=2)))
    height = _settled_height(page, frame)
    scroll_height, client_height, content_bottom, inner_height = frame.evaluate(INNER_JS)
    assert scroll_height <= client_height
    assert inner_height - content_bottom < 30
    assert height < 400


@pytest.mark.parametrize("kind", ["head", "neuron"])
def test_output_out_of_view_is_drawn(notebook: Callable[..., Any], kind: str) -> None:
    """An output further down the notebook gets no animation frame until scrolled to; it must be drawn
    (and sized) before that, without being scrolled into view."""
    page, frame = notebook(View(kind, synthetic_view(kind, n=12, layers=2, heads=3)), spacer=3000)
    assert page.evaluate("document.querySelector('iframe').getBoundingClientRect().top") > 2000
    ink = frame.evaluate(
        """() => {
          const canvas = document.getElementById("bt-canvas");
          const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
          let count = 0;
          for (let i = 3; i < data.length; i += 4) if (data[i] > 0) count++;
          return count;
        }"""
    )
    assert ink > 500
    _settled_height(page, frame)
    assert frame.evaluate(INNER_JS)[0] <= frame.evaluate(INNER_JS)[1]


def test_a_growing_output_out_of_view_draws_every_row(notebook: Callable[..., Any]) -> None:
    """A narrow neuron view's toolbar wraps, so its frame starts shorter than the view and grows to the
    height the page reports; out of view, the page gets no resize event until scrolled to, so the token
    rows below the first frame's height stayed blank. Every row must be drawn without scrolling."""
    page, frame = notebook(View("neuron", synthetic_view("neuron", n=40, layers=2, heads=3)), 3000, 450)
    assert page.evaluate("document.querySelector('iframe').getBoundingClientRect().top") > 2000
    # [canvas height, lane height (every token row), ink in the canvas's last 5 rows] in CSS px
    canvas_height, lane_height, bottom_ink = frame.evaluate(
        """() => {
          const canvas = document.getElementById("bt-canvas");
          const scale = canvas.width / canvas.getBoundingClientRect().width;
          const rows = Math.round(5 * 18 * scale);
          const ctx = canvas.getContext("2d");
          const data = ctx.getImageData(0, canvas.height - rows, canvas.width, rows).data;
          let ink = 0;
          for (let i = 3; i < data.length; i += 4) if (data[i] > 0) ink++;
          const lane = document.querySelector(".bt-lane").offsetHeight;
          return [canvas.getBoundingClientRect().height, lane, ink];
        }"""
    )
    assert lane_height == 40 * 18
    assert canvas_height == lane_height
    assert bottom_ink > 500


def test_load_model_prints_no_progress_bars(
    tiny_model_dirs: dict[str, Path], capfd: pytest.CaptureFixture
) -> None:
    """transformers' "Loading weights" bar printed to stderr (a red block with a TqdmWarning in Jupyter)."""
    folder = tiny_model_dirs["bert"]  # built on first use: its saving bars are not what is tested
    before = transformers_logging.set_tqdm_hook(None)
    transformers_logging.set_tqdm_hook(before)
    capfd.readouterr()
    bertology.load_model(folder)
    assert capfd.readouterr().err == ""
    assert transformers_logging.set_tqdm_hook(before) is before  # the process-wide hook is as it was


def test_quiet_loading_leaves_other_threads_bars_alone() -> None:
    kinds: dict[str, type] = {}

    def open_bar(name: str) -> None:
        bar = transformers_logging.tqdm(range(1), disable=True)
        kinds[name] = type(bar)
        bar.close()

    with _quiet_weight_loading():
        open_bar("loading thread")
        other = threading.Thread(target=open_bar, args=("other thread",))
        other.start()
        other.join()
    assert kinds["loading thread"] is transformers_logging.EmptyTqdm
    assert kinds["other thread"] is not transformers_logging.EmptyTqdm


def test_views_and_results_print_one_line_and_show_a_summary_table(
    default_model: bertology.LoadedModel, sample_corpus_head: Callable[[int], Path], ewt_dev: Path
) -> None:
    """A notebook cell's ``text/plain`` of a view or a result is one short line, not its payload or arrays
    (a head view's repr was 19 kB, a corpus analysis's 81 kB); results show their summary as a table."""
    from bertology.analysis.analyze import analyze_corpus
    from bertology.analysis.settings import AnalysisSettings
    from bertology.probes import probe_dependencies

    view = bertology.head_view("The cat sat on the mat.", model=default_model)
    assert repr(view) == f"View(kind='head', {view.token_count}, {view.title!r})" and len(repr(view)) < 200
    analysis = analyze_corpus(sample_corpus_head(8), default_model, AnalysisSettings(limit=4))
    probe = probe_dependencies(ewt_dev, default_model, limit=8)
    for result in (analysis, probe):
        assert "\n" not in repr(result) and len(repr(result)) < 400, repr(result)
        assert repr(result).startswith(f"{type(result).__name__}(model=")
        table = result._repr_html_()
        assert table.count("<tr>") == len(result.summary()) and "<script" not in table


@pytest.mark.slow
def test_load_model_in_a_notebook_prints_nothing_on_stderr(tmp_path: Path) -> None:
    """In an IPython kernel without ipywidgets, importing tqdm.auto (as transformers does) warns "TqdmWarning:
    IProgress not found", a red block under ``load_model()``; the cell prints only its own line."""
    import nbformat
    from nbclient import NotebookClient

    source = "import bertology\nmodel = bertology.load_model()\nprint('loaded')"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(tmp_path)}}).execute()
    streams = [(output["name"], output["text"]) for output in notebook.cells[0].outputs]
    assert streams == [("stdout", "loaded\n")]


@pytest.mark.slow
def test_an_executed_notebook_of_three_views_and_an_analysis_stays_small(tmp_path: Path) -> None:
    """Run as nbconvert runs a notebook (nbclient, an IPython kernel): the head, model and neuron view of
    the README's sentence on the default model and the sample corpus's analysis as cells' values. Each
    view's page inlines the same 120 kB of code, so three views made 670 kB; sent deflated, under 300 kB."""
    import nbformat
    from nbclient import NotebookClient

    cells = [
        "import bertology\n"
        "from bertology.analysis.analyze import analyze_corpus\n"
        "from bertology.corpus.segments import sample_corpus\n"
        "model = bertology.load_model()\n"
        "att = bertology.capture('The cat sat on the mat.', model=model, qk=True)",
        "bertology.head_view(att)",
        "bertology.model_view(att)",
        "bertology.neuron_view(att, layer=2, head=3)",
        "analyze_corpus(sample_corpus(), model)",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "views.ipynb"
    nbformat.write(notebook, path)
    values = [output["data"] for cell in notebook.cells[1:] for output in cell.outputs if "data" in output]
    assert [value["text/html"].startswith("<iframe") for value in values] == [True] * 3 + [False]
    assert values[3]["text/plain"].startswith("CorpusAnalysis(model=")
    assert path.stat().st_size < 300_000
