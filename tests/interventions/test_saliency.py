"""Saliency: integrated gradients are complete, the gradient is the logit's slope, pages are safe."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError
from bertology.inputs import encode
from bertology.interventions.saliency import METHODS, explain
from bertology.models import LoadedModel, load_model, wrap_model


@pytest.fixture(scope="module")
def sst2_classifier() -> LoadedModel:
    """The default model with a fresh two-label head, scaled up so its logits vary with the input."""
    torch.manual_seed(0)
    loaded = load_model(classifier=True, labels=["negative", "positive"])
    with torch.no_grad():
        loaded.model.classifier.weight.mul_(50)
    return loaded


def target_logit(
    loaded: LoadedModel, embeddings: torch.Tensor, inputs: dict[str, torch.Tensor], target: int
) -> float:
    others = {name: tensor for name, tensor in inputs.items() if name != "input_ids"}
    with torch.inference_mode():
        return float(loaded.model(inputs_embeds=embeddings, **others).logits[0, target])


@pytest.mark.parametrize(
    ("text", "text_b"), [("A gripping, beautifully acted film.", None), ("A man walks.", "He is slow.")]
)
def test_integrated_gradients_are_complete(
    sst2_classifier: LoadedModel, text: str, text_b: str | None
) -> None:
    explanation = explain(sst2_classifier, text, text_b, steps=128)
    difference = explanation.logit - explanation.baseline_logit
    assert abs(difference) > 1e-2
    assert abs(explanation.completeness_gap) < 1e-2 * abs(difference)
    coarse = explain(sst2_classifier, text, text_b, steps=4)
    assert abs(coarse.completeness_gap) > abs(explanation.completeness_gap)  # the gap shrinks with steps
    ig = explanation.attributions["integrated_gradients"]
    assert np.all(ig[explanation.special] == 0)  # special tokens are kept in the baseline
    assert set(explanation.attributions) == set(METHODS)
    assert all(len(values) == len(explanation.tokens) for values in explanation.attributions.values())


def test_gradient_and_gradient_x_input(sst2_classifier: LoadedModel) -> None:
    text = "A dull and lifeless film."
    loaded = wrap_model(copy.deepcopy(sst2_classifier.model).double(), sst2_classifier.tokenizer, "float64")
    explanation = explain(loaded, text, steps=4)
    target = list(loaded.model.config.id2label.values()).index(explanation.label)
    inputs = loaded.model_inputs(encode(loaded.tokenizer, [text], max_length=64))
    with torch.no_grad():
        x = loaded.model.get_input_embeddings()(inputs["input_ids"])
    assert target_logit(loaded, x, inputs, target) == pytest.approx(explanation.logit, abs=1e-5)
    # gradient x input is the slope of f as one token's embedding is scaled: a central difference
    for token in (1, 2, 4):
        up, down = x.clone(), x.clone()
        up[0, token] *= 1 + 1e-6
        down[0, token] *= 1 - 1e-6
        slope = (target_logit(loaded, up, inputs, target) - target_logit(loaded, down, inputs, target)) / 2e-6
        assert explanation.attributions["gradient_x_input"][token] == pytest.approx(slope, rel=1e-4)
    # the plain gradient's size, signed like gradient x input
    point = x.clone().requires_grad_(True)
    others = {name: tensor for name, tensor in inputs.items() if name != "input_ids"}
    (gradient,) = torch.autograd.grad(loaded.model(inputs_embeds=point, **others).logits[0, target], point)
    expected = gradient[0].norm(dim=-1).numpy() * np.sign(explanation.attributions["gradient_x_input"])
    np.testing.assert_allclose(explanation.attributions["gradient"], expected, rtol=1e-4, atol=1e-7)


def test_explanation_needs_a_step(sst2_classifier: LoadedModel) -> None:
    with pytest.raises(BertologyError, match="at least one step"):
        explain(sst2_classifier, "fine", steps=0)


def test_explain_command_writes_a_safe_page_and_json(sst2_classifier: LoadedModel, tmp_path: Path) -> None:
    run = tmp_path / "run"
    sst2_classifier.model.save_pretrained(run / "model")
    sst2_classifier.tokenizer.save_pretrained(run / "model")
    target = tmp_path / "out" / "why.html"
    text = 'A <script>alert("x")</script> & <b>bold</b> film'
    result = CliRunner().invoke(app, ["explain", str(run), text, "-o", str(target), "--steps", "8"])
    assert result.exit_code == 0, result.output
    assert "Predicted" in result.output
    page = target.read_text()
    assert "<script>" not in page and "<b>bold" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt; film" in page
    assert 'http-equiv="Content-Security-Policy"' in page and "Integrated gradients" in page
    data = json.loads(target.with_suffix(".json").read_text())
    assert data["text"] == text and data["label"] in ("negative", "positive") and data["steps"] == 8
    assert len(data["attributions"]["integrated_gradients"]) == len(data["tokens"])
