"""Encoder-decoder (BART, T5) and decoder-only (GPT-2) models: capture, kinds, view data and the CLI.

The models are small random ones built from configs with real tokenizer kinds (tests/tiny_models.py).
Captured attention is compared with what a plain eager model returns with ``output_attentions=True``.

Tolerances: captured encoder, decoder and cross-attention against transformers' output_attentions of the
same float32 pass: atol 1e-6; rows sum to 1 within 1e-5 (a float32 sum); the view's 8-bit codes within
HALF_STEP (half of 1/255).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from support.cli import run_command
from support.tiny_models import GENERATIVE_ARCHITECTURES, save_tiny_model
from transformers import AutoModel

import bertology
from bertology.attention.seq2seq import Seq2SeqAttention, capture_seq2seq
from bertology.models.loading import LoadedModel, load_model, require_encoder
from bertology.views import render_view, seq2seq_view
from bertology.views.build import seq2seq_view_data, view_data
from bertology.views.payload import unpack

SOURCE = "I went to the store."
TARGET = "She bought fresh strawberries at the store."
HALF_STEP = 0.5 / 255 + 1e-6


@pytest.fixture(scope="session")
def generative_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generative_models")
    return {architecture: save_tiny_model(architecture, root) for architecture in GENERATIVE_ARCHITECTURES}


@pytest.fixture(scope="session")
def loaded(generative_dirs: dict[str, Path]) -> dict[str, LoadedModel]:
    return {architecture: load_model(path) for architecture, path in generative_dirs.items()}


@pytest.fixture(scope="session")
def bart_attention(loaded: dict[str, LoadedModel]) -> Seq2SeqAttention:
    return capture_seq2seq(SOURCE, TARGET, model=loaded["bart"])


def _eager_seq2seq(directory: Path, loaded: LoadedModel) -> dict[str, np.ndarray]:
    """Encoder, decoder and cross-attention [layers, heads, q, k] from a plain eager model, independently
    tokenized: source as input, decoder input = start token + target labels but the last."""
    model = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = loaded.tokenizer
    labels = tokenizer(text_target=TARGET)["input_ids"]
    decoder_ids = torch.tensor([[model.config.decoder_start_token_id, *labels[:-1]]])
    with torch.no_grad():
        out = model(
            **tokenizer([SOURCE], return_tensors="pt"), decoder_input_ids=decoder_ids, output_attentions=True
        )
    stack = lambda layers: torch.stack(layers)[:, 0].numpy()  # noqa: E731
    return {
        "encoder": stack(out.encoder_attentions),
        "decoder": stack(out.decoder_attentions),
        "cross": stack(out.cross_attentions),
    }


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_seq2seq_capture_equals_output_attentions(
    architecture: str, generative_dirs: dict[str, Path], loaded: dict[str, LoadedModel]
) -> None:
    captured = capture_seq2seq(SOURCE, TARGET, model=loaded[architecture])
    expected = _eager_seq2seq(generative_dirs[architecture], loaded[architecture])
    encoder_layers, decoder_layers = (3, 2) if architecture == "bart" else (2, 2)
    source, target = len(captured.source_tokens), len(captured.target_tokens)
    assert source != target
    assert captured.encoder.shape == (encoder_layers, 4, source, source)
    assert captured.decoder.shape == (decoder_layers, 4, target, target)
    assert captured.cross.shape == (decoder_layers, 4, target, source)
    for name in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(captured.probs(name), expected[name], atol=1e-6)
        np.testing.assert_allclose(captured.probs(name).sum(-1), 1.0, atol=1e-5)
    assert not np.triu(captured.decoder, k=1).any()  # the decoder cannot see later target tokens
    later_rows, later_keys = np.triu_indices(source, k=1)
    assert captured.encoder[:, :, later_rows, later_keys].min() > 0  # the encoder sees every token


@pytest.mark.parametrize(("architecture", "start"), [("bart", "</s>"), ("t5", "<pad>")])
def test_decoder_reads_start_token_then_labels_but_the_last(
    architecture: str, start: str, loaded: dict[str, LoadedModel]
) -> None:
    captured = capture_seq2seq(SOURCE, TARGET, model=loaded[architecture])
    tokenizer = loaded[architecture].tokenizer
    labels = tokenizer.convert_ids_to_tokens(tokenizer(text_target=TARGET)["input_ids"])
    assert captured.target_tokens == [start, *labels[:-1]]
    assert captured.source_tokens == tokenizer.convert_ids_to_tokens(tokenizer(SOURCE)["input_ids"])


def test_gpt2_capture_is_causal_and_equals_output_attentions(
    generative_dirs: dict[str, Path], loaded: dict[str, LoadedModel]
) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    attention = bertology.capture(text, model=loaded["gpt2"], qk=True)
    model = AutoModel.from_pretrained(generative_dirs["gpt2"], attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**loaded["gpt2"].tokenizer([text], return_tensors="pt"), output_attentions=True)
    expected = torch.stack(out.attentions)[:, 0].numpy()
    assert attention.probs.shape == expected.shape == (2, 4, len(attention.tokens), len(attention.tokens))
    np.testing.assert_allclose(attention.probs, expected, atol=1e-6)
    np.testing.assert_allclose(attention.probs.sum(-1), 1.0, atol=1e-5)
    assert not np.triu(attention.probs, k=1).any()
    assert view_data(attention, "model")["causal"] is True
    assert view_data(attention, "neuron")["causal"] is True  # its softmax leaves later keys out


def test_encoder_view_is_not_marked_causal(default_model: LoadedModel) -> None:
    assert "causal" not in view_data(bertology.capture("The cat sat.", model=default_model), "head")


def test_model_kinds(loaded: dict[str, LoadedModel], default_model: LoadedModel) -> None:
    kinds = {name: model.kind for name, model in loaded.items()}
    assert kinds == {"bart": "encoder-decoder", "t5": "encoder-decoder", "gpt2": "decoder"}
    assert default_model.kind == "encoder"
    assert (
        type(loaded["bart"].model).__name__ == "BartModel" and type(loaded["t5"].model).__name__ == "T5Model"
    )


def test_encoder_only_work_is_refused_for_other_kinds(
    loaded: dict[str, LoadedModel], generative_dirs: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(
        bertology.BertologyError, match=r"Probing works on encoder models .* decoder GPT-2 model"
    ):
        require_encoder(loaded["gpt2"], "Probing")
    require_encoder(bertology.load_model(), "Probing")  # an encoder passes
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One line of text.\n")
    from bertology.analysis.analyze import analyze_corpus

    with pytest.raises(
        bertology.BertologyError,
        match=r"Corpus analysis works on encoder and decoder models; .* encoder-decoder",
    ):
        analyze_corpus(corpus, loaded["t5"])
    with pytest.raises(bertology.BertologyError, match=r"A sequence classifier .* works on encoder models"):
        load_model(generative_dirs["bart"], classifier=True, labels=["a", "b"])


def test_wrong_inputs_are_clear_errors(loaded: dict[str, LoadedModel]) -> None:
    with pytest.raises(bertology.BertologyError, match="no template for a pair of texts"):
        render_view("One text.", "Another text.", kind="head", model=loaded["gpt2"])
    with pytest.raises(bertology.BertologyError, match="is a decoder model; a source and a target text need"):
        capture_seq2seq(SOURCE, TARGET, model=loaded["gpt2"])
    with pytest.raises(bertology.BertologyError, match="needs a target text as well as the source text"):
        render_view(SOURCE, kind="head", model=loaded["bart"])
    with pytest.raises(
        bertology.BertologyError, match="The neuron view is not available for encoder-decoder"
    ):
        render_view(SOURCE, kind="neuron", model=loaded["bart"], target=TARGET)
    with pytest.raises(bertology.BertologyError, match="A target text is for encoder-decoder models"):
        render_view(SOURCE, kind="head", model=loaded["gpt2"], target=TARGET)
    with pytest.raises(bertology.BertologyError, match="The target text is empty"):
        capture_seq2seq(SOURCE, "  ", model=loaded["t5"])
    # The library's capture refuses what it cannot do, as the views do.
    with pytest.raises(bertology.BertologyError, match="no template for a pair of texts"):
        bertology.capture("One text.", "Another text.", model=loaded["gpt2"])
    with pytest.raises(
        bertology.BertologyError, match="is an encoder-decoder model; capture it from a source"
    ):
        bertology.capture_batch([SOURCE], model=loaded["bart"])


def test_seq2seq_view_data_round_trips(bart_attention: Seq2SeqAttention) -> None:
    data = seq2seq_view_data(bart_attention, "model", attention_set="decoder", layer=1)
    assert (data["view"], data["attentionSet"], data["layer"]) == ("model", "decoder", 1)
    sets = {entry["name"]: entry for entry in data["attentionSets"]}
    assert list(sets) == ["encoder", "decoder", "cross"]
    for name, entry in sets.items():
        probs = bart_attention.probs(name)
        assert unpack(entry["attention"]).shape == probs.shape
        np.testing.assert_allclose(unpack(entry["attention"]) / 255.0, probs, atol=HALF_STEP)
        assert (entry["layers"], entry["heads"], entry["n"]) == probs.shape[:3]
        assert entry["causal"] is (name == "decoder")
    assert sets["encoder"]["tokens"] == bart_attention.source_tokens and "keyTokens" not in sets["encoder"]
    assert sets["cross"]["tokens"] == bart_attention.target_tokens
    assert sets["cross"]["keyTokens"] == bart_attention.source_tokens
    page = seq2seq_view(bart_attention, kind="model").html
    for entry in sets.values():
        assert page.count(entry["attention"]["data"]) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "neuron"}, "The neuron view is not available"),
        (
            {"kind": "head", "attention_set": "self"},
            "Unknown attention 'self'; choose one of encoder, decoder",
        ),
        ({"kind": "head", "attention_set": "cross", "layer": 2}, "Layer 2 does not exist; there are 2 cross"),
    ],
)
def test_seq2seq_view_data_refuses_bad_options(
    bart_attention: Seq2SeqAttention, options: dict, message: str
) -> None:
    with pytest.raises(bertology.BertologyError, match=message):
        seq2seq_view_data(bart_attention, **options)


def test_head_names_travel_with_the_view_data(loaded: dict[str, LoadedModel]) -> None:
    attention = bertology.capture("A short text.", model=loaded["gpt2"])
    names = [f"h{index}" for index in range(4)]
    assert view_data(attention, "model", head_names=names)["headNames"] == names
    assert "headNames" not in view_data(attention, "model")
    with pytest.raises(bertology.BertologyError, match="one head name per head: 4 names, not 3"):
        view_data(attention, "model", head_names=names[:3])


@pytest.mark.slow
def test_cli_writes_an_encoder_decoder_view(
    generative_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "x.html"
    model = str(generative_dirs["bart"])
    result = run_command(
        ["view", SOURCE, "--target", TARGET, "--model", model, "--attention", "encoder", "-o", str(output)],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"Wrote the head view of \d+ source and \d+ target tokens to", result.stdout)
    match = re.search(r'id="bertology-data">(.*?)</script>', output.read_text(), re.S)
    data = json.loads(match.group(1))
    assert data["attentionSet"] == "encoder" and [s["name"] for s in data["attentionSets"]][-1] == "cross"

    refused = run_command(["view", SOURCE, "--target", TARGET, "--model", model, "--view", "neuron"], capsys)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "The neuron view is not available for encoder-decoder models" in refused.stderr


def test_long_target_is_cut_with_a_warning(loaded: dict[str, LoadedModel]) -> None:
    long_target = " ".join(["the quick brown fox"] * 30)
    with pytest.warns(bertology.TruncationWarning, match=r"The target has .* tokens were cut from the end"):
        captured = capture_seq2seq(SOURCE, long_target, model=loaded["bart"])
    assert len(captured.target_tokens) == loaded["bart"].max_length == 64


def test_a_target_for_an_encoder_is_refused_in_words(default_model: LoadedModel) -> None:
    with pytest.raises(bertology.BertologyError, match="'all-MiniLM-L6-v2' is an encoder model"):
        render_view(SOURCE, kind="head", model=default_model, target=TARGET)
