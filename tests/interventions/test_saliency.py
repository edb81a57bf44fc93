"""Saliency: integrated gradients are complete, the gradient is the logit's slope, SmoothGrad is the mean
gradient over seeded noise, pages are safe.

Tolerances: a logit recomputed here from the same float32 embeddings, abs 1e-5 (a few units of 2^-24 on
logits of order 1 after a dozen layers); a central difference of step 1e-6 against the gradient: rel 1e-4
(its truncation error is second order, its rounding about 2^-24 / 1e-6 of the logit); a gradient taken
again by autograd: rtol 1e-4 (the same float32 chain, reordered); SmoothGrad's mean over the same seeded
noise in other batches: rtol 1e-6 (float32 means of the same gradients, summed in another order).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_models import tiny_classifier
from typer.testing import CliRunner

from bertology.cli import app
from bertology.corpus.encoding import encode
from bertology.errors import BertologyError
from bertology.interventions.saliency import METHODS, explain
from bertology.models.loading import LoadedModel, load_model, wrap_model


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
    ig = explanation.attributions["integrated-gradients"]
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
        assert explanation.attributions["input-x-gradient"][token] == pytest.approx(slope, rel=1e-4)
    # the plain gradient's size, signed like gradient x input
    point = x.clone().requires_grad_(True)
    others = {name: tensor for name, tensor in inputs.items() if name != "input_ids"}
    (gradient,) = torch.autograd.grad(loaded.model(inputs_embeds=point, **others).logits[0, target], point)
    expected = gradient[0].norm(dim=-1).numpy() * np.sign(explanation.attributions["input-x-gradient"])
    np.testing.assert_allclose(explanation.attributions["gradient"], expected, rtol=1e-4, atol=1e-7)


@pytest.fixture(scope="module")
def tiny_bert(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    """A small random BERT classifier (3 layers, width 32), in float64 so sums compare closely."""
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    return wrap_model(loaded.model.double(), loaded.tokenizer, "tiny-bert-float64")


PAIR = ("Researchers measured how much each head attends.", "The quick brown fox jumps.")


def test_smoothgrad_without_noise_is_the_plain_gradient(tiny_bert: LoadedModel) -> None:
    explanation = explain(tiny_bert, *PAIR, methods=["gradient", "smoothgrad"], noise=0.0, samples=5)
    assert (
        list(explanation.attributions) == ["gradient", "smoothgrad"] and explanation.completeness_gap is None
    )
    gradient = explanation.attributions["gradient"]
    assert np.abs(gradient).min() > 1e-6  # every token has a gradient to compare
    np.testing.assert_allclose(explanation.attributions["smoothgrad"], gradient, rtol=1e-6)


def test_smoothgrad_is_the_mean_gradient_over_its_seeded_noise(tiny_bert: LoadedModel) -> None:
    """Against torch.autograd, one noisy copy at a time, with the noise the docstring specifies."""
    noise, samples, seed = 0.1, 6, 7
    explanation = explain(tiny_bert, *PAIR, methods=["smoothgrad"], noise=noise, samples=samples, seed=seed)
    inputs = tiny_bert.model_inputs(encode(tiny_bert.tokenizer, [PAIR[0]], [PAIR[1]], max_length=64))
    others = {name: tensor for name, tensor in inputs.items() if name != "input_ids"}
    target = list(tiny_bert.model.config.id2label.values()).index(explanation.label)
    with torch.no_grad():
        x = tiny_bert.model.get_input_embeddings()(inputs["input_ids"])[0]
    generator = torch.Generator().manual_seed(seed)
    sigma = noise * float(x.max() - x.min())
    total = torch.zeros_like(x)
    for _ in range(samples):
        point = (x + sigma * torch.randn(x.shape, generator=generator).double()).requires_grad_(True)
        logit = tiny_bert.model(inputs_embeds=point[None], **others).logits[0, target]
        total += torch.autograd.grad(logit, point)[0]
    mean = total / samples
    expected = mean.norm(dim=-1) * torch.sign((mean * x).sum(-1))
    np.testing.assert_allclose(explanation.attributions["smoothgrad"], expected.numpy(), rtol=1e-6)
    plain = explain(tiny_bert, *PAIR, methods=["gradient"]).attributions["gradient"]
    assert np.abs(explanation.attributions["smoothgrad"] - plain).max() > 1e-3 * np.abs(plain).max()


@pytest.mark.slow
def test_smoothgrad_is_seeded_and_its_mean_settles(tiny_bert: LoadedModel) -> None:
    def smoothgrad(samples: int, seed: int, batch_size: int = 64) -> np.ndarray:
        return explain(
            tiny_bert,
            *PAIR,
            methods=["smoothgrad"],
            noise=0.1,
            samples=samples,
            seed=seed,
            batch_size=batch_size,
        ).attributions["smoothgrad"]

    first = smoothgrad(40, seed=3)
    np.testing.assert_array_equal(first, smoothgrad(40, seed=3))  # the same seed, the same numbers
    np.testing.assert_allclose(first, smoothgrad(40, seed=3, batch_size=7), rtol=1e-6)  # any batch size
    assert not np.allclose(first, smoothgrad(40, seed=4))
    # two seeds' means differ by the sampling error, which shrinks as 1/sqrt(samples)
    few = [smoothgrad(10, seed) for seed in (0, 1)]
    many = [smoothgrad(160, seed) for seed in (0, 1)]
    spread_few = np.linalg.norm(few[0] - few[1])
    spread_many = np.linalg.norm(many[0] - many[1])
    assert spread_many < spread_few / 2  # sqrt(16) = 4 expected
    assert spread_many < 0.05 * np.linalg.norm(many[0])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"steps": 0}, "at least one step"),
        ({"samples": 0}, "at least one sample"),
        ({"noise": -0.1}, "noise level must be a finite number of at least 0"),
        ({"methods": ["lime"]}, "Unknown saliency method 'lime'"),
        ({"methods": []}, "at least one saliency method"),
    ],
)
def test_explanation_settings_are_checked(tiny_bert: LoadedModel, settings: dict, message: str) -> None:
    with pytest.raises(BertologyError, match=message):
        explain(tiny_bert, "fine", **settings)


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
    assert len(data["attributions"]["integrated-gradients"]) == len(data["tokens"])
