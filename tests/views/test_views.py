"""View pages from Python: exact encodings, data embedded once, hostile text kept inert, notebook display."""

from __future__ import annotations

import base64
import html
import json
import re
import zlib

import numpy as np
import pytest

import bertology
from bertology.models.loading import LoadedModel
from bertology.views.build import view_data
from bertology.views.payload import pack_attention, pack_float16, script_json, unpack

HOSTILE = "</script><img src=x onerror=alert(1)>"


def _embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="bertology-data">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_attention_codes_round_trip_within_half_a_step() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(7), size=(2, 3, 7)).astype(np.float32)  # [layers, heads, n, n]
    packed = pack_attention(probs)
    codes = unpack(packed)
    assert codes.dtype == np.uint8 and codes.shape == probs.shape and packed["scale"] == 255
    assert np.abs(codes / 255.0 - probs).max() <= 0.5 / 255 + 1e-7


def test_float16_round_trip() -> None:
    values = np.linspace(-3, 3, 2 * 2 * 5 * 4, dtype=np.float32).reshape(2, 2, 5, 4)
    np.testing.assert_array_equal(unpack(pack_float16(values)), values.astype(np.float16))


def test_script_json_cannot_close_the_script() -> None:
    text = script_json({"tokens": [HOSTILE, "a&b", "\u2028"]})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text)["tokens"] == [HOSTILE, "a&b", "\u2028"]


@pytest.mark.parametrize("kind", ["head", "model", "neuron"])
def test_hostile_token_is_data_only(kind: str, default_model: LoadedModel) -> None:
    attention = bertology.capture("harmless words", model=default_model, qk=True)
    attention.tokens[1] = HOSTILE
    page = bertology.views.render_view(attention, kind=kind).html
    assert HOSTILE not in page and "<img" not in page and "</script><" not in page
    assert _embedded_data(page)["tokens"][1] == HOSTILE
    assert page.count("<script") == 2  # the data block and the inlined viewer script, nothing else


def test_page_is_self_contained_with_data_once(default_model: LoadedModel) -> None:
    attention = bertology.capture(
        "I went to the store.", "At the store, I bought fresh strawberries.", model=default_model
    )
    page = bertology.model_view(attention).html
    data = _embedded_data(page)
    assert page.count(data["attention"]["data"]) == 1
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    codes = unpack(data["attention"])
    # 8-bit codes: half a step, plus float32 rounding of the weights
    np.testing.assert_allclose(codes / 255.0, attention.probs, atol=0.5 / 255 + 1e-6)
    assert data["pair"] is True and data["segments"] == attention.segment_ids.tolist()


def test_neuron_view_carries_queries_keys_and_scaling(default_model: LoadedModel) -> None:
    view = bertology.neuron_view("The cat sat.", model=default_model, layer=2, head=3)
    data = view.data
    assert "attention" not in data and data["layer"] == 2 and data["head"] == 3
    queries = unpack(data["queries"])
    assert queries.shape == (6, 12, 6, 32) and queries.dtype == np.float16
    assert data["scaling"] == pytest.approx([32**-0.5] * 6)


def test_neuron_view_without_qk_is_a_clear_error(default_model: LoadedModel) -> None:
    attention = bertology.capture("The cat sat.", model=default_model)
    with pytest.raises(bertology.BertologyError, match="capture with qk=True"):
        view_data(attention, "neuron")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("layer", 6, "Layer 6 does not exist; there are 6 layers"),
        ("head", -1, "Head -1 does not exist; there are 12 heads"),
        ("query", 99, "Query token 99 does not exist"),
    ],
)
def test_out_of_range_selection_is_a_clear_error(
    option: str, value: int, message: str, default_model: LoadedModel
) -> None:
    attention = bertology.capture("The cat sat.", model=default_model)
    with pytest.raises(bertology.BertologyError, match=message):
        view_data(attention, "head", **{option: value})


def test_notebook_display_is_an_isolated_iframe(default_model: LoadedModel, tmp_path) -> None:
    view = bertology.head_view("A small test.", model=default_model)
    shown = view._repr_html_()
    assert shown.startswith('<iframe id="bertology-') and 'sandbox="allow-scripts allow-downloads"' in shown
    loader = html.unescape(re.search(r'srcdoc="(.*?)" sandbox', shown, re.S).group(1))
    packed = re.search(r'atob\("([A-Za-z0-9+/=]+)"\)', loader).group(1)  # the page travels deflated
    assert zlib.decompress(base64.b64decode(packed)).decode("utf-8") == view.html
    assert len(shown) < len(view.html) / 2
    saved = view.save(tmp_path / "sub" / "view.html")
    assert saved.read_text(encoding="utf-8") == view.html
