"""The BertViz-compatible entry point: ``head_view(attention=outputs.attentions, tokens=tokens)``.

The attention comes from a plain ``model(**inputs, output_attentions=True)`` call (the default model,
tiny random BART, T5, GPT-2 and RoBERTa-family models), never from bertology's capture, and the pages
it gives are compared, decoded, with the pages of ``head_view(text)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.browser import ViewPage
from support.tiny_models import save_tiny_model

import bertology
from bertology.attention.capturing import capture
from bertology.attention.seq2seq import capture_seq2seq
from bertology.models.loading import LoadedModel
from bertology.views import PageHTML, View, seq2seq_view
from bertology.views.bertviz import attention_from_outputs, is_special_token, words_from_tokens
from bertology.views.payload import unpack

TEXT_A = "I went to the store."
TEXT_B = "At the store, I bought fresh strawberries."
TARGET = "She bought fresh strawberries at the store."


class Outputs:
    """A model's ``outputs.attentions`` for one input and the arguments BertViz's call takes with it."""

    def __init__(self, loaded: LoadedModel, *texts: str) -> None:
        self.inputs = loaded.tokenizer(*texts, return_tensors="pt")
        with torch.inference_mode():
            self.attentions = loaded.model(**self.inputs, output_attentions=True).attentions
        self.tokens = loaded.tokenizer.convert_ids_to_tokens(self.inputs["input_ids"][0])
        types = self.inputs.get("token_type_ids")  # BERT's segment ids (RoBERTa has none)
        pair = len(texts) == 2 and types is not None
        self.sentence_b_start = types[0].tolist().index(1) if pair else None


@pytest.fixture(scope="module")
def pair(default_model: LoadedModel) -> Outputs:
    return Outputs(default_model, TEXT_A, TEXT_B)


def _decoded(data: dict[str, Any]) -> dict[str, Any]:
    """Page data with every packed array decoded (numpy arrays), so that two pages compare by content."""
    if "attentionSets" in data:
        return {**data, "attentionSets": [_decoded(entry) for entry in data["attentionSets"]]}
    return {key: unpack(value) if key == "attention" else value for key, value in data.items()}


def _assert_same_page(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    _assert_equal(_decoded(actual), _decoded(expected), "page")


def _assert_equal(actual: Any, expected: Any, where: str) -> None:
    """Decoded page data equal key by key (arrays exactly), saying where they differ."""
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            _assert_equal(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert len(actual) == len(expected), where
        for number, (got, want) in enumerate(zip(actual, expected, strict=True)):
            _assert_equal(got, want, f"{where}[{number}]")
    elif isinstance(expected, np.ndarray):
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    else:
        assert actual == expected, where


# --- The same page as head_view(text) -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["head", "model"])
def test_bertviz_call_gives_the_page_of_the_text(
    kind: str, default_model: LoadedModel, pair: Outputs
) -> None:
    view = getattr(bertology, f"{kind}_view")
    expected = view(TEXT_A, TEXT_B, model=default_model).data
    keywords = view(
        attention=pair.attentions,
        tokens=pair.tokens,
        sentence_b_start=pair.sentence_b_start,
        model_name=default_model.name,
    )
    positional = view(pair.attentions, pair.tokens, pair.sentence_b_start)  # BertViz's order
    assert isinstance(keywords, View) and keywords.kind == kind
    assert expected["pair"] and expected["tokens"][0] == "[CLS]"
    _assert_same_page(keywords.data, expected)
    _assert_same_page(positional.data, {**expected, "model": "model"})


def test_single_text_and_a_captured_attention_still_work(default_model: LoadedModel) -> None:
    single = Outputs(default_model, TEXT_A)
    expected = bertology.head_view(TEXT_A, model=default_model).data
    _assert_same_page(
        bertology.head_view(single.attentions, single.tokens, model_name=default_model.name).data, expected
    )
    _assert_same_page(bertology.head_view(capture(TEXT_A, model=default_model)).data, expected)
    assert not expected["pair"]


def test_the_attention_is_the_one_capture_builds(default_model: LoadedModel, pair: Outputs) -> None:
    captured = capture(TEXT_A, TEXT_B, model=default_model)
    built = attention_from_outputs(pair.attentions, pair.tokens, sentence_b_start=pair.sentence_b_start)
    np.testing.assert_array_equal(built.probs, captured.probs)
    assert built.tokens == captured.tokens
    np.testing.assert_array_equal(built.segment_ids, captured.segment_ids)
    np.testing.assert_array_equal(built.special, captured.special)
    assert built.queries is None and built.keys is None and np.isnan(built.scaling).all()
    # WordPiece does not say whether a space came before punctuation: "store." is two words here.
    words = " ".join(built.words)
    assert words == "i went to the store . at the store , i bought fresh strawberries ."
    assert built.word_ids[15:17].tolist() == [13, 13]  # straw ##berries
    assert built.word_segments.tolist() == [0] * 6 + [1] * 9


@pytest.mark.parametrize("architecture", ["roberta", "xlm-roberta"])
def test_words_of_marked_tokens_are_the_captured_words(
    architecture: str, tiny_model_dirs: dict[str, Path]
) -> None:
    """Byte-level BPE (Ġ) and SentencePiece (▁) tokens say where spaces were: the words rebuilt from them
    are capture's words, which come from the tokenizer's character offsets."""
    loaded = bertology.load_model(tiny_model_dirs[architecture])
    outputs = Outputs(loaded, TEXT_A, TEXT_B)
    captured = capture(TEXT_A, TEXT_B, model=loaded)
    built = attention_from_outputs(outputs.attentions, outputs.tokens, prettify_tokens=False)
    assert built.tokens == captured.tokens
    # the same float32 weights, from transformers' output_attentions and from the capture: 1e-6
    np.testing.assert_allclose(built.probs, captured.probs, atol=1e-6)
    np.testing.assert_array_equal(built.special, captured.special)
    assert built.words == captured.words
    np.testing.assert_array_equal(built.word_ids, captured.word_ids)


def test_words_and_special_tokens_from_token_strings() -> None:
    tokens = ["<s>", "▁", "Straw", "berries", "▁are", "▁red.", "</s>", "<pad>"]
    special = np.array([is_special_token(token) for token in tokens])
    assert special.tolist() == [True, False, False, False, False, False, True, True]
    word_ids, words = words_from_tokens(tokens, special)
    assert words == ["Strawberries", "are", "red."]
    assert word_ids.tolist() == [-1, 0, 0, 0, 1, 2, -1, -1]
    assert all(map(is_special_token, ["[CLS]", "[SEP]", "<|endoftext|>", "<bos>", "<extra_id_3>"]))
    assert not any(map(is_special_token, ["<", "s", "[cls]", "<b>", "Ġ<s>"]))


# --- Inputs: torch or numpy, per layer or stacked, one input of a batch -------------------------


def test_numpy_and_stacked_inputs_equal_torch_input(pair: Outputs) -> None:
    expected = bertology.head_view(pair.attentions, pair.tokens).data
    per_layer = [layer.numpy() for layer in pair.attentions]
    stacked = torch.stack(pair.attentions)  # [layers, batch, heads, n, n]
    for attention in (
        per_layer,
        tuple(per_layer),
        stacked,
        stacked.numpy(),
        stacked[:, 0],
        stacked[:, 0].numpy(),
    ):
        _assert_same_page(bertology.head_view(attention, pair.tokens).data, expected)
    half = bertology.head_view([layer.half() for layer in pair.attentions], pair.tokens).data
    codes = unpack(half["attention"]).astype(int) - unpack(expected["attention"]).astype(int)
    assert np.abs(codes).max() <= 1  # float16 rounds a weight by less than one 8-bit step


def test_index_picks_one_input_of_a_batch(default_model: LoadedModel) -> None:
    batch = default_model.tokenizer([TEXT_A, TEXT_B], return_tensors="pt", padding=True)
    with torch.inference_mode():
        attentions = default_model.model(**batch, output_attentions=True).attentions
    tokens = default_model.tokenizer.convert_ids_to_tokens(batch["input_ids"][1])
    expected = bertology.head_view([layer[1:2] for layer in attentions], tokens).data
    _assert_same_page(bertology.head_view(attentions, tokens, index=1).data, expected)
    _assert_same_page(bertology.head_view(torch.stack(attentions), tokens, index=1).data, expected)
    assert bertology.head_view(attentions, tokens, index=0).data["n"] == len(tokens)  # padded to the batch


# --- Validation ---------------------------------------------------------------------------------


def _bad_inputs(outputs: Outputs) -> list[tuple[dict[str, Any], str]]:
    layers, tokens = list(outputs.attentions), outputs.tokens
    twice = [torch.cat([layer, layer]) for layer in layers]
    wide = [torch.cat([layer, layer[..., :1] * 0], dim=-1) for layer in layers]
    return [
        ({"attention": layers}, "Give tokens="),
        ({"attention": layers, "tokens": tokens[:-1]}, "has 19 positions but tokens has 18 tokens"),
        ({"attention": layers, "tokens": " ".join(tokens)}, "tokens must be a list of token strings"),
        ({"attention": [], "tokens": tokens}, "attention holds no layers"),
        ({"attention": (), "tokens": tokens}, "outputs[-1], with transformers 5 that is the cross"),
        ({"attention": {"attention": 1}, "tokens": tokens}, "must be the per-layer attention tensors"),
        ({"attention": [layer[0] for layer in layers], "tokens": tokens}, "not [batch, heads, q, k]"),
        (
            {"attention": torch.stack(layers)[None], "tokens": tokens},
            "pass one [batch, heads, q, k] tensor per layer",
        ),
        (
            {"attention": [*layers[:-1], layers[-1][:, :6]], "tokens": tokens},
            "attention[5] has shape (6, 19, 19)",
        ),
        ({"attention": twice, "tokens": tokens}, "holds a batch of 2 inputs; pick one with index= (0 to 1)"),
        ({"attention": twice, "tokens": tokens, "index": 2}, "index 2 does not exist"),
        ({"attention": torch.stack(layers)[:, 0], "tokens": tokens, "index": 0}, "with no batch axis"),
        ({"attention": wide, "tokens": tokens}, "maps 19 queries to 20 keys"),
        (
            {"attention": [layer * 3 for layer in layers], "tokens": tokens},
            "layer 0, head 0, query 0 sum to 3",
        ),
        ({"attention": [layer.log() for layer in layers], "tokens": tokens}, "negative, infinite or NaN"),
        (
            {"attention": layers, "tokens": tokens, "sentence_b_start": 19},
            "sentence_b_start 19 is not inside",
        ),
        ({"attention": layers, "tokens": tokens, "include_layers": [0, 6]}, "include_layers holds 6"),
        (
            {"attention": layers, "tokens": tokens, "include_heads": [1, 1]},
            "include_heads must list distinct",
        ),
        (
            {"attention": layers, "tokens": tokens, "include_layers": [1, 2], "layer": 0},
            "Layer 0 is not among",
        ),
        ({"attention": layers, "tokens": tokens, "heads": [12]}, "Head 12 is not among"),
        ({"attention": layers, "tokens": tokens, "display_mode": "blue"}, "display_mode must be"),
        ({"attention": layers, "tokens": tokens, "html_action": "show"}, "html_action must be"),
        ({"attention": layers, "tokens": tokens, "encoder_tokens": tokens}, "not both"),
        ({"tokens": tokens}, "Give a text to see"),
    ]


def test_every_bad_input_gets_one_clear_sentence(pair: Outputs) -> None:
    for options, message in _bad_inputs(pair):
        with pytest.raises(bertology.BertologyError) as caught:
            bertology.head_view(**options)
        sentence = str(caught.value)
        assert message in sentence, sentence
        assert sentence.endswith(".") and ". " not in sentence, sentence  # one sentence


def test_refusals_of_the_other_views_and_of_double_arguments(pair: Outputs) -> None:
    cases = [
        (lambda: bertology.neuron_view(pair.attentions, pair.tokens), "needs query and key vectors"),
        (lambda: bertology.model_view(pair.attentions, pair.tokens, heads=[0]), "use include_heads="),
        (lambda: bertology.model_view(), "model_view(attention=outputs.attentions"),
        (
            lambda: bertology.head_view("A text.", "Another.", "A third."),
            "sentence_b_start is A third., but the second text starts at token 5",
        ),
    ]
    for call, message in cases:
        with pytest.raises(bertology.BertologyError) as caught:
            call()
        assert message in str(caught.value)
    # Python's own answer to an argument given twice or too many, as for BertViz's functions
    with pytest.raises(TypeError, match="multiple values for argument 'attention'"):
        bertology.head_view(pair.attentions, attention=pair.attentions, tokens=pair.tokens)
    with pytest.raises(TypeError, match="multiple values for argument 'tokens'"):
        bertology.head_view(pair.attentions, pair.tokens, tokens=pair.tokens)
    with pytest.raises(TypeError, match="takes from 0 to 13 positional arguments but 14 were given"):
        bertology.model_view(*[None] * 14)


# --- BertViz's options --------------------------------------------------------------------------


def test_layers_and_heads_to_include_and_show_first(pair: Outputs) -> None:
    probs = torch.stack(pair.attentions)[:, 0].numpy()
    head = bertology.head_view(
        pair.attentions, pair.tokens, include_layers=[4, 1], layer=1, heads=[7, 2]
    ).data
    assert (head["layers"], head["heads"], head["layer"]) == (2, 12, 1)
    assert head["layerNames"] == ["4", "1"] and head["selectedHeads"] == [2, 7]
    np.testing.assert_array_equal(unpack(head["attention"]), np.rint(probs[[4, 1]] * 255))
    positional = bertology.head_view(
        pair.attentions, pair.tokens, None, True, 1, [7, 2], include_layers=[4, 1]
    )
    _assert_same_page(positional.data, head)
    model = bertology.model_view(
        pair.attentions, pair.tokens, include_heads=[11, 0], display_mode="dark"
    ).data
    assert (model["layers"], model["heads"], model["theme"]) == (6, 2, "dark")
    assert model["headNames"] == ["11", "0"] and "layerNames" not in model
    np.testing.assert_array_equal(unpack(model["attention"]), np.rint(probs[:, [11, 0]] * 255))


def test_prettify_tokens_as_bertviz_does(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = bertology.load_model(tiny_model_dirs["roberta"])
    outputs = Outputs(loaded, TEXT_A)
    pretty = bertology.head_view(outputs.attentions, outputs.tokens).data["tokens"]
    raw = bertology.head_view(outputs.attentions, outputs.tokens, prettify_tokens=False).data["tokens"]
    assert raw == outputs.tokens and "Ġthe" in raw
    assert pretty == [token.replace("Ġ", " ") for token in raw] and " the" in pretty


def test_html_action_returns_the_page_or_shows_it(pair: Outputs, monkeypatch: pytest.MonkeyPatch) -> None:
    returned = bertology.head_view(pair.attentions, pair.tokens, html_action="return")
    assert isinstance(returned, PageHTML)
    assert returned.data == returned.view.html and returned.data.lstrip().lower().startswith(
        "<!doctype html>"
    )
    assert returned._repr_html_().startswith("<iframe")
    shown: list[Any] = []
    monkeypatch.setattr("IPython.display.display", shown.append)
    assert bertology.model_view(pair.attentions, pair.tokens, html_action="view") is None
    assert len(shown) == 1 and isinstance(shown[0], View) and shown[0].kind == "model"


# --- Decoders and encoder-decoders --------------------------------------------------------------


@pytest.fixture(scope="module")
def generative(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoadedModel]:
    root = tmp_path_factory.mktemp("bertviz_models")
    return {name: bertology.load_model(save_tiny_model(name, root)) for name in ("bart", "t5", "gpt2")}


def test_decoder_attention_is_drawn_causal(generative: dict[str, LoadedModel]) -> None:
    outputs = Outputs(generative["gpt2"], TARGET)
    data = bertology.model_view(outputs.attentions, outputs.tokens, prettify_tokens=False).data
    expected = bertology.model_view(TARGET, model=generative["gpt2"], prettify_tokens=False).data
    assert data["causal"] is True
    _assert_same_page(data, {**expected, "model": "model"})


def _seq2seq_outputs(loaded: LoadedModel) -> tuple[Any, list[str], list[str]]:
    """A plain forward pass with teacher forcing: the decoder reads its start token and the target's
    labels but the last (as capture_seq2seq documents)."""
    labels = loaded.tokenizer(text_target=TARGET)["input_ids"]
    decoder_ids = torch.tensor([[loaded.model.config.decoder_start_token_id, *labels[:-1]]])
    source = loaded.tokenizer(TEXT_A, return_tensors="pt")
    with torch.inference_mode():
        outputs = loaded.model(**source, decoder_input_ids=decoder_ids, output_attentions=True)
    tokens = loaded.tokenizer.convert_ids_to_tokens
    return outputs, tokens(source["input_ids"][0]), tokens(decoder_ids[0])


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_encoder_decoder_keywords_give_the_seq2seq_page(
    architecture: str, generative: dict[str, LoadedModel]
) -> None:
    loaded = generative[architecture]
    outputs, encoder_tokens, decoder_tokens = _seq2seq_outputs(loaded)
    expected = seq2seq_view(capture_seq2seq(TEXT_A, TARGET, model=loaded), attention_set="encoder").data
    view = bertology.head_view(
        encoder_attention=outputs.encoder_attentions,
        decoder_attention=outputs.decoder_attentions,
        cross_attention=outputs.cross_attentions,
        encoder_tokens=encoder_tokens,
        decoder_tokens=decoder_tokens,
        prettify_tokens=False,
        model_name=loaded.name,
    )
    assert view.token_count == f"{len(encoder_tokens)} source and {len(decoder_tokens)} target tokens"
    _assert_same_page(view.data, expected)

    cross_view = bertology.model_view(
        cross_attention=[layer.numpy() for layer in outputs.cross_attentions],
        encoder_tokens=encoder_tokens,
        decoder_tokens=decoder_tokens,
        include_layers=[1],
    )
    assert cross_view.token_count == view.token_count
    cross_only = cross_view.data
    (entry,) = cross_only["attentionSets"]
    assert cross_only["attentionSet"] == "cross" and entry["layerNames"] == ["1"]
    assert entry["causal"] is False and len(entry["keyTokens"]) == len(encoder_tokens)
    cross = np.stack([layer[0].numpy() for layer in outputs.cross_attentions])
    np.testing.assert_array_equal(_decoded(entry)["attention"], np.rint(cross[1:] * 255))
    encoder_only = bertology.head_view(
        encoder_attention=outputs.encoder_attentions, encoder_tokens=encoder_tokens
    )
    assert encoder_only.token_count == f"{len(encoder_tokens)} source tokens"


def test_encoder_decoder_keywords_are_checked(generative: dict[str, LoadedModel]) -> None:
    outputs, encoder_tokens, decoder_tokens = _seq2seq_outputs(generative["bart"])
    cross = outputs.cross_attentions
    cases = [
        ({"cross_attention": cross, "decoder_tokens": decoder_tokens}, "Give encoder_tokens="),
        ({"decoder_attention": outputs.decoder_attentions}, "Give decoder_tokens="),
        (
            {"cross_attention": cross, "encoder_tokens": decoder_tokens, "decoder_tokens": decoder_tokens},
            "encoder_tokens has",
        ),
        ({"encoder_attention": cross, "encoder_tokens": decoder_tokens}, "self-attention is square"),
        (
            {
                "encoder_attention": outputs.encoder_attentions,
                "encoder_tokens": encoder_tokens,
                "sentence_b_start": 2,
            },
            "sentence_b_start is for a pair",
        ),
    ]
    for options, message in cases:
        with pytest.raises(bertology.BertologyError) as caught:
            bertology.head_view(**options)
        assert message in str(caught.value)


# --- In the browser: the labels of the layers kept and the heads shown first ---------------------


@pytest.mark.browser
def test_pages_name_the_layers_kept_and_show_the_heads_chosen(
    open_page: Callable[[dict[str, Any]], ViewPage], pair: Outputs
) -> None:
    options = {"include_layers": [4, 1], "layer": 1, "heads": [2, 7]}
    head = open_page(bertology.head_view(pair.attentions, pair.tokens, **options).data, "head")
    assert head.js("[...document.querySelectorAll('#bt-layer option')].map((o) => o.textContent)") == [
        "4",
        "1",
    ]
    assert head.state()["layer"] == 1 and head.state()["heads"] == [2, 7]
    pressed = head.js(
        "[...document.querySelectorAll('.bt-swatch')].map((b) => b.getAttribute('aria-pressed'))"
    )
    assert [index for index, value in enumerate(pressed) if value == "true"] == [2, 7]
    assert head.ink() > 0
    head.assert_clean()
    model = open_page(bertology.model_view(pair.attentions, pair.tokens, include_layers=[5, 3]).data, "model")
    assert model.js("[...document.querySelectorAll('.bt-row-label')].map((l) => l.textContent)") == ["5", "3"]
    model.js("window.bertology.openDetail(0, 4)")
    assert model.js("document.querySelector('#bt-detail h2').textContent") == "Layer 5 · head 4"
    model.assert_clean()
