"""Every keyword BertViz documents, in the attention-tensor and the text forms of ``head_view``,
``model_view`` and ``neuron_view``, with a transformers model object and tokenizer as well as a name
(issue 25, item 9), and BertViz's ``neuron_view.show`` (``bertology.bertviz.neuron_view.show``).

BertViz's signatures (jessevig/bertviz, head_view.py, model_view.py, neuron_view.py):
``head_view(attention, tokens, sentence_b_start, prettify_tokens=True, layer, heads, encoder_attention,
decoder_attention, cross_attention, encoder_tokens, decoder_tokens, include_layers, html_action='view')``;
``model_view(attention, tokens, sentence_b_start, prettify_tokens=True, display_mode='dark', [the
encoder-decoder keywords], include_layers, include_heads, html_action='view')``;
``neuron_view.show(model, model_type, tokenizer, sentence_a, sentence_b=None, display_mode='dark',
layer=None, head=None, html_action='view')``. The encoder-decoder keywords are checked in
test_views_bertviz.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

import bertology
from bertology.attention.capturing import capture
from bertology.bertviz import head_view as bertviz_head_view
from bertology.bertviz import model_view as bertviz_model_view
from bertology.bertviz.neuron_view import show
from bertology.models.loading import LoadedModel, default_model_path
from bertology.views import PageHTML, View
from bertology.views.payload import unpack

TEXT_A = "The cat sat on the mat."
TEXT_B = "The cat lay on the rug."


@pytest.fixture(scope="module")
def transformers_model() -> tuple[PreTrainedModel, Any]:
    """all-MiniLM-L6-v2 as a user loads it: transformers' own classes, its default attention."""
    return AutoModel.from_pretrained(default_model_path()), AutoTokenizer.from_pretrained(
        default_model_path()
    )


@pytest.fixture(scope="module")
def outputs(transformers_model: tuple[PreTrainedModel, Any]) -> dict[str, Any]:
    """``model(**inputs, output_attentions=True).attentions`` of the pair (a model loaded with eager
    attention, as BertViz's users load it), its tokens and where B starts."""
    tokenizer = transformers_model[1]
    model = AutoModel.from_pretrained(default_model_path(), attn_implementation="eager")
    inputs = tokenizer(TEXT_A, TEXT_B, return_tensors="pt")
    with torch.inference_mode():
        attentions = model(**inputs, output_attentions=True).attentions
    return {
        "attention": attentions,
        "tokens": tokenizer.convert_ids_to_tokens(inputs["input_ids"][0]),
        "sentence_b_start": inputs["token_type_ids"][0].tolist().index(1),
    }


def _decoded(data: dict[str, Any]) -> dict[str, Any]:
    return {
        key: unpack(value) if isinstance(value, dict) and "codec" in value else value
        for key, value in data.items()
    }


def _assert_same_page(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    actual, expected = _decoded(actual), _decoded(expected)
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(actual[key], value, err_msg=key)
        else:
            assert actual[key] == value, key


HEAD_KEYWORDS = {"prettify_tokens": False, "layer": 3, "heads": [5, 1], "include_layers": [4, 3, 0]}
MODEL_KEYWORDS = {
    "prettify_tokens": False,
    "display_mode": "light",
    "include_layers": [5, 2],
    "include_heads": [11, 0, 7],
}


@pytest.mark.parametrize(("kind", "keywords"), [("head", HEAD_KEYWORDS), ("model", MODEL_KEYWORDS)])
def test_every_bertviz_keyword_in_tensor_and_text_forms(
    kind: str, keywords: dict[str, Any], outputs: dict[str, Any], default_model: LoadedModel
) -> None:
    view = getattr(bertology, f"{kind}_view")
    tensor = view(**outputs, **keywords, html_action="return")
    assert isinstance(tensor, PageHTML) and tensor.view.kind == kind
    data = tensor.view.data
    kept_layers = keywords["include_layers"]
    assert data["layerNames"] == [str(layer) for layer in kept_layers] and data["pair"]
    probs = torch.stack(outputs["attention"])[:, 0].numpy()[kept_layers]
    if kind == "head":
        assert (data["layer"], data["selectedHeads"], data["theme"]) == (1, [1, 5], "light")
    else:
        probs = probs[:, keywords["include_heads"]]
        assert data["headNames"] == ["11", "0", "7"] and data["theme"] == "light"
    np.testing.assert_array_equal(unpack(data["attention"]), np.rint(probs * 255))
    # The text form takes the same keywords (sentence_b_start is checked against where text B starts)
    # and gives the same page, the attention captured by bertology instead of returned by the model.
    text = view(
        TEXT_A,
        TEXT_B,
        model=default_model,
        sentence_b_start=outputs["sentence_b_start"],
        model_name="model",
        **keywords,
        html_action="return",
    )
    assert isinstance(text, PageHTML)
    _assert_same_page(text.view.data, data)
    # BertViz's import path gives the same functions.
    assert bertviz_head_view is bertology.head_view and bertviz_model_view is bertology.model_view


def test_neuron_view_text_form_takes_the_keywords(default_model: LoadedModel) -> None:
    page = bertology.neuron_view(
        TEXT_A,
        TEXT_B,
        model=default_model,
        layer=4,
        head=7,
        include_layers=[4, 1],
        include_heads=[2, 7],
        display_mode="light",
        prettify_tokens=True,
        html_action="return",
    )
    data = page.view.data
    assert (data["layer"], data["head"], data["theme"]) == (0, 1, "light")
    assert (data["layerNames"], data["headNames"], data["pair"]) == (["4", "1"], ["2", "7"], True)
    captured = capture(TEXT_A, TEXT_B, model=default_model, qk=True)
    for name in ("queries", "keys"):
        expected = getattr(captured, name)[np.ix_([4, 1], [2, 7])].astype(np.float16)
        np.testing.assert_array_equal(unpack(data[name]), expected, err_msg=name)
    assert data["scaling"] == captured.scaling[[4, 1]].tolist()


def test_default_themes_are_bertviz_defaults(outputs: dict[str, Any], default_model: LoadedModel) -> None:
    """BertViz's model view and neuron view are dark unless told otherwise; its head view is light."""
    assert bertology.model_view(**outputs).data["theme"] == "dark"
    assert bertology.model_view(TEXT_A, model=default_model).data["theme"] == "dark"
    assert bertology.neuron_view(TEXT_A, model=default_model).data["theme"] == "dark"
    assert bertology.head_view(**outputs).data["theme"] == "light"
    assert bertology.head_view(TEXT_A, model=default_model, theme="dark").data["theme"] == "dark"


def test_a_transformers_model_object_and_tokenizer(
    transformers_model: tuple[PreTrainedModel, Any], default_model: LoadedModel
) -> None:
    model, tokenizer = transformers_model
    before = (model.config._attn_implementation, model.training, tokenizer.padding_side, tokenizer.pad_token)
    for kind in ("head", "model", "neuron"):
        view = getattr(bertology, f"{kind}_view")
        given = view(TEXT_A, TEXT_B, model=model, tokenizer=tokenizer, layer=2)
        loaded = view(TEXT_A, TEXT_B, model=default_model, layer=2)
        assert isinstance(given, View) and given.data["model"] == str(model.name_or_path)
        _assert_same_page({**given.data, "model": "m"}, {**loaded.data, "model": "m"})
    # The user's model and tokenizer are left as they were.
    after = (model.config._attn_implementation, model.training, tokenizer.padding_side, tokenizer.pad_token)
    assert after == before
    for call, message in [
        (lambda: bertology.head_view(TEXT_A, model=model), "Give tokenizer= with a transformers model"),
        (
            lambda: bertology.head_view(TEXT_A, model=default_model, tokenizer=tokenizer),
            "brings its own tokenizer",
        ),
    ]:
        with pytest.raises(bertology.BertologyError, match=message):
            call()


def test_neuron_view_show_is_a_drop_in(
    transformers_model: tuple[PreTrainedModel, Any],
    default_model: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, tokenizer = transformers_model
    page = show(model, "bert", tokenizer, TEXT_A, TEXT_B, layer=2, head=3, html_action="return")
    assert isinstance(page, PageHTML)
    expected = bertology.neuron_view(TEXT_A, TEXT_B, model=default_model, layer=2, head=3).data
    _assert_same_page({**page.view.data, "model": "m"}, {**expected, "model": "m"})
    assert page.view.data["theme"] == "dark" and page.view.data["pair"]
    light = show(model, "bert", tokenizer, TEXT_A, display_mode="light", html_action="return")
    assert light.view.data["theme"] == "light" and not light.view.data["pair"]
    shown: list[Any] = []
    monkeypatch.setattr("IPython.display.display", shown.append)
    assert show(model, "bert", tokenizer, TEXT_A) is None  # BertViz's html_action='view'
    assert len(shown) == 1 and shown[0].kind == "neuron"
    with pytest.raises(bertology.BertologyError, match="model_type 'bart'"):
        show(model, "bart", tokenizer, TEXT_A)


def test_text_forms_refuse_what_only_tensors_carry(
    outputs: dict[str, Any], default_model: LoadedModel
) -> None:
    with pytest.raises(TypeError, match="multiple values for argument 'tokens'"):  # the 2nd text's place
        bertology.head_view(TEXT_A, TEXT_B, model=default_model, tokens=outputs["tokens"])
    cases = [
        ({"index": 0}, "index= goes with"),
        ({"sentence_b_start": 3}, "the second text starts at token 9"),
        ({"display_mode": "light", "theme": "dark"}, "Give display_mode or theme, not both"),
        ({"display_mode": "sepia"}, "display_mode must be 'light' or 'dark'"),
        ({"include_layers": [9]}, "include_layers holds 9"),
        ({"encoder_tokens": ["a"]}, "encoder_tokens= goes with a model's attention tensors"),
    ]
    for options, message in cases:
        with pytest.raises(bertology.BertologyError, match=message):
            bertology.head_view(TEXT_A, TEXT_B, model=default_model, **options)
    with pytest.raises(bertology.BertologyError, match="nowhere: there is one text"):
        bertology.head_view(TEXT_A, model=default_model, sentence_b_start=4)
