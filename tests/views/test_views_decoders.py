"""Decoder views as a user meets them (issue 43, item 7): tokens without the word-start marks Ġ and ▁ in
the views (command line, library, web app) and in patching's tables, the neuron view opening on the last
token (a decoder's first query sees only itself), the quantised model's note on its pages, and one default
theme per view for every front end."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import run_in_process

from bertology.attention.capturing import capture
from bertology.models.loading import LoadedModel, load_model
from bertology.models.model_store import SMOLLM2_NOTE
from bertology.report.patching import write_patching_report
from bertology.server.compute import statistics_answer
from bertology.server.schemas import InputRequest
from bertology.views import render_view

TEXT = "When Mary and John went to the store, John gave a drink to"


def _page_data(path: Path) -> dict[str, Any]:
    """The view data a page written by ``bertology view`` carries."""
    found = re.search(r'id="bertology-data">(.*?)</script>', path.read_text(encoding="utf-8"), re.DOTALL)
    assert found is not None
    return json.loads(found.group(1))


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_the_view_command_shows_tokens_without_word_start_marks(
    model_type: str,
    tiny_model_dirs: dict[str, Path],
    loaded_types: Callable[[str], LoadedModel],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GPT-2's byte-level BPE marks a word's start with Ġ, Llama's SentencePiece with ▁: shown as spaces
    unless ``--no-prettify`` asks for the tokens as the tokenizer writes them."""
    raw = capture(TEXT, model=loaded_types(model_type)).tokens
    mark = "Ġ" if model_type == "gpt2" else "▁"
    assert sum(mark in token for token in raw) >= 8  # the test's premise: most words carry the mark
    model = str(tiny_model_dirs[model_type])
    pretty, plain = tmp_path / "pretty.html", tmp_path / "plain.html"
    assert run_in_process(["view", TEXT, "-m", model, "-o", str(pretty)], capsys)[0] == 0
    assert run_in_process(["view", TEXT, "-m", model, "--no-prettify", "-o", str(plain)], capsys)[0] == 0
    assert _page_data(pretty)["tokens"] == [token.replace(mark, " ") for token in raw]
    assert " to" in _page_data(pretty)["tokens"]
    assert _page_data(plain)["tokens"] == raw


def test_faint_and_the_default_themes_of_the_view_command(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--faint`` reaches the page; without ``--theme`` the model and neuron views are dark and the head
    view light, as the library's views and BertViz's (one default for every front end)."""
    model = str(tiny_model_dirs["llama"])
    themes = {}
    for kind in ("head", "model", "neuron"):
        page = tmp_path / f"{kind}.html"
        assert run_in_process(["view", TEXT, "-m", model, "--view", kind, "-o", str(page)], capsys)[0] == 0
        themes[kind] = _page_data(page)["theme"]
    assert themes == {"head": "light", "model": "dark", "neuron": "dark"}
    faint = tmp_path / "faint.html"
    assert (
        run_in_process(["view", TEXT, "-m", model, "--faint", "--theme", "dark", "-o", str(faint)], capsys)[0]
        == 0
    )
    assert _page_data(faint)["faintLines"] is True and _page_data(faint)["theme"] == "dark"
    assert "faintLines" not in _page_data(tmp_path / "head.html")


def test_a_decoders_neuron_view_opens_on_the_last_token(loaded_types: Callable[[str], LoadedModel]) -> None:
    """The first query of causal attention sees only itself (every other key masked); the last sees all.
    An encoder's view still opens on the first token, and a query asked for is kept."""
    decoder = loaded_types("llama")
    n = len(capture(TEXT, model=decoder).tokens)
    assert render_view(TEXT, kind="neuron", model=decoder).data["query"] == n - 1
    assert render_view(TEXT, kind="neuron", model=decoder, query=2).data["query"] == 2
    assert render_view(TEXT, kind="neuron", model=loaded_types("bert")).data["query"] == 0


def test_the_web_apps_tokens_and_view_are_shown_without_marks(
    loaded_types: Callable[[str], LoadedModel],
) -> None:
    """The inspect page lists the statistics answer's tokens; its view is ``render_view``'s."""
    decoder = loaded_types("gpt2")
    answer = statistics_answer(decoder, InputRequest(text=TEXT), max_tokens=64)
    assert answer["tokens"] == [token.replace("Ġ", " ") for token in capture(TEXT, model=decoder).tokens]
    assert not any("Ġ" in token for token in answer["tokens"])


def test_patching_tables_show_tokens_without_marks_and_a_quantised_models_note(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """position_effects.csv's ``clean_token`` and the report's plots show tokens as the views do; a report
    of smollm2-135m (here the tiny Llama's study under its name) opens with its quantised file's note."""
    from dataclasses import replace

    import pandas as pd

    from bertology.interventions.patching import patch
    from bertology.interventions.patching_pairs import PatchPair

    llama = load_model(tiny_model_dirs["llama"], language_model=True)
    clean, corrupted = "The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"
    pair = PatchPair(clean, corrupted, " the", " dog", None, None, 1)
    study = patch(llama, [pair], site="resid_pre", granularity="position")
    write_patching_report(study, tmp_path / "tiny")
    tokens = pd.read_csv(tmp_path / "tiny" / "position_effects.csv", keep_default_na=False)["clean_token"]
    assert " fox" in set(tokens) and not any("▁" in token for token in tokens)
    assert "quantised" not in (tmp_path / "tiny" / "report.html").read_text(encoding="utf-8")
    report = write_patching_report(replace(study, model_name="smollm2-135m"), tmp_path / "smollm2")
    opening = SMOLLM2_NOTE.split(":")[0]  # the note up to its first quote, which the page escapes
    assert f'<p class="warning">Note: {opening}:' in report.read_text(encoding="utf-8")


def test_smollm2_views_show_plain_tokens_the_last_query_and_the_quantised_note(
    smollm2_model: LoadedModel,
) -> None:
    """The real decoder: its byte-level BPE tokens as words with spaces, the neuron view on the last token,
    and every view's caption saying that its weights come from a quantised file."""
    raw = capture(TEXT, model=smollm2_model, qk=True)
    assert sum(token.startswith("Ġ") for token in raw.tokens) >= 8
    neuron = render_view(raw, kind="neuron")
    assert neuron.data["query"] == len(raw.tokens) - 1
    head = render_view(raw, kind="head")
    assert head.data["tokens"] == [token.replace("Ġ", " ") for token in raw.tokens]
    assert " Mary" in head.data["tokens"]
    for view in (neuron, head):
        assert view.data["caption"] == f"Note: {SMOLLM2_NOTE}."
