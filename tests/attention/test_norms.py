"""Norm-based attention weights (Kobayashi et al. 2020): equal to a direct computation from each layer's
weights, known answers on constructed inputs, and the switch in capture, analysis and the CLI.

Tolerances: the norm-based weights and value norms are computed here by hand and by the capture from the
same float32 tensors in another order (products with the output projection, norms over d <= 384, a
normalising sum): relative error about sqrt(d)·2^-24 through a square root and a ratio, so rtol 1e-4 with
atol 1e-6 for weights near 0. The neuron view's page carries the norms as float16 (relative 2^-11 = 4.9e-4:
rtol 2e-3) and the attention as 8-bit codes (half a step, 1/510 = 2e-3, then reweighed by those norms:
atol 3e-3).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.browser import open_view
from transformers import AutoModel
from typer.testing import CliRunner

import bertology
from bertology.analysis.analyze import analyze_corpus
from bertology.analysis.settings import AnalysisSettings
from bertology.attention.norms import norm_weights
from bertology.cli import app
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, default_model_path
from bertology.views import neuron_view

TEXT_A, TEXT_B = "I went to the store.", "At the store, I bought fresh strawberries."


def _direct_norm_weights(directory: Path | str, loaded: LoadedModel) -> tuple[np.ndarray, np.ndarray]:
    """(weights [layers, heads, n, n], norms [layers, heads, n]) from an independently loaded eager model:
    each layer's input hidden states, its value projection, each head's block of the output projection,
    ``||f(x_j)||`` and ``a_ij ||f(x_j)||`` row-normalised."""
    reference = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    inputs = dict(loaded.tokenizer(TEXT_A, TEXT_B, return_tensors="pt"))
    if loaded.model_type == "distilbert":
        inputs.pop("token_type_ids")
    with torch.no_grad():
        outputs = reference(**inputs, output_attentions=True, output_hidden_states=True)
        layers = reference.encoder.layer if loaded.model_type == "bert" else reference.transformer.layer
        result, all_norms = [], []
        for index, layer in enumerate(layers):
            x = outputs.hidden_states[index][0]  # [n, hidden]: the layer's input
            if loaded.model_type == "bert":
                value, output = layer.attention.self.value, layer.attention.output.dense
            else:
                value, output = layer.attention.v_lin, layer.attention.out_lin
            heads = outputs.attentions[index].shape[1]
            values = value(x).reshape(x.shape[0], heads, -1)  # [n, heads, head_dim]
            d = values.shape[-1]
            norms = torch.stack(
                [
                    torch.linalg.vector_norm(values[:, h] @ output.weight[:, h * d : (h + 1) * d].T, dim=-1)
                    for h in range(heads)
                ]
            )  # [heads, n]: ||f_h(x_j)||
            weighted = outputs.attentions[index][0] * norms[:, None, :]
            result.append(weighted / weighted.sum(-1, keepdim=True))
            all_norms.append(norms)
    return torch.stack(result).numpy(), torch.stack(all_norms).numpy()


@pytest.mark.parametrize("architecture", ["bert", "distilbert"])
def test_norm_weights_equal_direct_computation_on_tiny_models(
    architecture: str, tiny_model_dirs: dict[str, Path]
) -> None:
    directory = tiny_model_dirs[architecture]
    loaded = bertology.load_model(directory)
    captured = bertology.capture(TEXT_A, TEXT_B, model=loaded, weights="norm", qk=True)
    assert captured.weights == "norm"
    weights, norms = _direct_norm_weights(directory, loaded)
    np.testing.assert_allclose(captured.probs, weights, rtol=1e-4, atol=1e-6)
    assert captured.value_norms is not None
    np.testing.assert_allclose(captured.value_norms, norms, rtol=1e-4, atol=1e-6)


def test_norm_weights_equal_direct_computation_on_default_model(default_model: LoadedModel) -> None:
    captured = bertology.capture(TEXT_A, TEXT_B, model=default_model, weights="norm")
    expected, _ = _direct_norm_weights(default_model_path(), default_model)
    np.testing.assert_allclose(captured.probs, expected, rtol=1e-4, atol=1e-6)
    assert captured.value_norms is None  # kept only with qk=True, for the neuron view
    # The weights differ from the softmax output: [SEP] and [CLS] carry vectors of small norm.
    plain = bertology.capture(TEXT_A, TEXT_B, model=default_model)
    special = np.flatnonzero(plain.special)
    assert captured.probs[..., special].sum(-1).mean() < plain.probs[..., special].sum(-1).mean()


def test_norm_weights_known_answer() -> None:
    probs = torch.tensor([[[[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]]])  # [batch 1, head 1, query 2, key 3]
    norms = torch.tensor([[[1.0, 3.0, 2.0]]])  # [batch, head, key]
    # Row 0: 0.5 * 1, 0.5 * 3, 0 -> sum 2; row 1: 0.25 * 1, 0.25 * 3, 0.5 * 2 -> sum 2.
    expected = torch.tensor([[[[0.25, 0.75, 0.0], [0.125, 0.375, 0.5]]]])
    torch.testing.assert_close(norm_weights(probs, norms), expected)


def test_equal_norms_leave_the_attention_unchanged() -> None:
    probs = torch.softmax(torch.randn(2, 3, 5, 5), dim=-1)
    torch.testing.assert_close(norm_weights(probs, torch.full((2, 3, 5), 7.0)), probs)


def test_unknown_weights_is_a_clear_error(default_model: LoadedModel) -> None:
    with pytest.raises(BertologyError, match="Unknown weights 'value'"):
        bertology.capture(TEXT_A, model=default_model, weights="value")  # type: ignore[arg-type]


def test_streamed_norm_analysis_equals_statistics_of_captured_norm_weights(
    default_model: LoadedModel, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{TEXT_A}\n{TEXT_B}\n", encoding="utf-8")
    analysis = analyze_corpus(
        corpus, default_model, AnalysisSettings(weights="norm", js_tokens_per_segment=None)
    )
    assert analysis.weights == "norm" and analysis.summary()["weights"] == "norm"
    captured = bertology.capture(TEXT_A, TEXT_B, model=default_model, weights="norm", max_length=128)
    cls = captured.probs[:, :, :, 0].mean(-1)  # [layers, heads]: mean weight on [CLS] over query tokens
    np.testing.assert_allclose(analysis.surface["cls"], cls, rtol=1e-4, atol=1e-6)
    plain = analyze_corpus(corpus, default_model, AnalysisSettings(js_tokens_per_segment=None))
    assert not np.allclose(plain.surface["cls"], analysis.surface["cls"], atol=1e-3)


def test_cli_view_and_analyze_with_norm_weights(tmp_path: Path) -> None:
    runner = CliRunner()
    page = tmp_path / "view.html"
    result = runner.invoke(app, ["view", TEXT_A, TEXT_B, "--weights", "norm", "-o", str(page)])
    assert result.exit_code == 0, result.output
    assert "norm-based" in page.read_text(encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{TEXT_A}\n{TEXT_B}\n\n{TEXT_B}\n{TEXT_A}\n", encoding="utf-8")
    result = runner.invoke(
        app, ["analyze", str(corpus), "--weights", "norm", "--js-tokens", "0", "-o", str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["weights"] == "norm"
    assert "norm-based" in (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    result = runner.invoke(app, ["view", TEXT_A, "--view", "neuron", "--weights", "norm", "-o", str(page)])
    assert result.exit_code == 0, result.output
    assert '"valueNorms":' in page.read_text(encoding="utf-8")


@pytest.mark.browser
def test_neuron_view_shows_value_norms_and_norm_based_weights(
    chromium_browser: Any, default_model: LoadedModel, tmp_path: Path
) -> None:
    """The page's norm-based column equals the captured norm-based weights (float16 transport)."""
    attention = bertology.capture(TEXT_A, TEXT_B, model=default_model, weights="norm", qk=True)
    path = neuron_view(attention, layer=2, head=3, query=4).save(tmp_path / "neuron.html")
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        view = open_view(context, path)
        shown = view.js("window.bertology.neuron()")
        assert (shown["layer"], shown["head"], shown["query"]) == (2, 3, 4)
        assert attention.value_norms is not None
        np.testing.assert_allclose(shown["norms"], attention.value_norms[2, 3], rtol=2e-3)
        np.testing.assert_allclose(shown["normWeights"], attention.probs[2, 3, 4], atol=3e-3)
        labels = view.js("document.querySelector('.bt-neuron').textContent")
        assert "\u2016f(x)\u2016" in labels and "\u2016\u03b1 f(x)\u2016" in labels
        view.assert_clean()
    finally:
        context.close()
