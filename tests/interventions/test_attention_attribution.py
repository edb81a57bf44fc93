"""Self-attention attribution (Hao et al. 2021): the integral of the gradient with respect to each head's
attention map, computed by scaling head gates, equals the one computed by replacing the map itself; its
sum is F(A) - F(0) per layer and example; the attribution tree follows the paper's construction.

Tolerances: the gated integral against the replaced map: the same quadrature of float32 gradients taken
through two different graphs, rtol 1e-3 (each point's gradient differs by float32 rounding of order 1e-6
relative, and the points' weighted sum can cancel) with atol scaled to the largest value; attention rows sum
to 1 within rtol 1e-5 (float32); Gauss-Legendre's completeness gap within 1e-5 (the quadrature is exact to
float32 rounding for these smooth paths: the probabilities' float32 rounding summed over 10 points and the
layer's heads); a quadrature weight identity in float64, 1e-12; label probabilities p and 1 - p from one
float32 softmax, 1e-6; a mean of the same float32 maxima in another order, rtol 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.tiny_models import tiny_classifier
from transformers.masking_utils import eager_mask

from bertology.corpus.encoding import encode
from bertology.errors import BertologyError
from bertology.interventions.attention_attribution import (
    attribute,
    attribute_input,
    attribution_importance,
    integration_points,
)
from bertology.interventions.attribution_tree import TreeEdge, attribution_tree
from bertology.interventions.data import LabelledTexts
from bertology.interventions.pruning import prune_heads
from bertology.models.hook import recording
from bertology.models.loading import LoadedModel, load_model


def test_integration_points() -> None:
    alphas, weights = integration_points(4, "riemann")
    np.testing.assert_allclose(alphas, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(weights, [0.25] * 4)
    alphas, weights = integration_points(3, "gauss-legendre")
    assert np.all((alphas > 0) & (alphas < 1))
    assert float(np.sum(weights * alphas**5)) == pytest.approx(1 / 6, abs=1e-12)  # exact to degree 5
    with pytest.raises(BertologyError, match="Unknown integration rule"):
        integration_points(4, "trapezoid")  # type: ignore[arg-type]
    with pytest.raises(BertologyError, match="at least one step"):
        integration_points(0)


class ReplacedAttention:
    """An attention override that computes eager attention but hands layer ``layer`` the map
    ``replacement`` ([rows, heads, n, n]) in place of its own softmax output."""

    def __init__(self, layer: int, replacement: torch.Tensor) -> None:
        self.layer, self.replacement, self.calls = layer, replacement, 0

    def mask(self, **kwargs: Any) -> torch.Tensor | None:
        return eager_mask(**kwargs)

    def attend(
        self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, **kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = query @ key.transpose(2, 3) * kw["scaling"]
        probs = (scores if mask is None else scores + mask).softmax(-1)
        if self.calls == self.layer:
            probs = self.replacement
        self.calls += 1
        return (probs @ value).transpose(1, 2).contiguous(), probs


def replaced_map_attribution(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor], target: int, steps: int
) -> np.ndarray:
    """[layers, heads, n, n] the paper's computation: for each layer, the attention map itself replaced by
    α·A (a leaf tensor), the gradient of the target's probability taken with respect to it."""
    alphas, weights = integration_points(steps, "riemann")
    with torch.no_grad(), recording() as recorder:
        loaded.model(**inputs)
    maps = [call.probs[0] for call in recorder.calls]
    rows = {name: tensor.expand(steps, -1) for name, tensor in inputs.items()}
    result = []
    for layer, attention in enumerate(maps):
        scaled = (
            torch.as_tensor(alphas, dtype=torch.float32)[:, None, None, None] * attention
        ).requires_grad_()
        with recording(override=ReplacedAttention(layer, scaled)):
            probability = torch.softmax(loaded.model(**rows).logits, -1)[:, target]
        (gradient,) = torch.autograd.grad((probability * torch.as_tensor(weights)).sum(), scaled)
        result.append((attention * gradient.sum(0)).numpy())
    return np.stack(result)


def test_gated_attribution_equals_replacing_the_attention_map(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    loaded.model.eval()
    encoded = encode(loaded.tokenizer, ["The quick brown fox jumps."], ["It is slow."], max_length=64)
    inputs = loaded.model_inputs(encoded)
    ours = attribute_input(loaded, inputs, 1, steps=6, rows_per_pass=4)  # two passes per layer
    expected = replaced_map_attribution(loaded, inputs, 1, 6)
    assert np.abs(expected).max() > 1e-5
    np.testing.assert_allclose(
        ours.attribution.numpy(), expected, rtol=1e-3, atol=1e-6 * np.abs(expected).max()
    )


@pytest.mark.parametrize("model_type", ["bert", "roberta", "albert", "distilbert", "electra"])
def test_completeness_on_every_encoder(tiny_model_dirs: dict[str, Path], model_type: str) -> None:
    loaded = tiny_classifier(tiny_model_dirs[model_type])
    if model_type == "distilbert":  # its two scaled-up head layers saturate the softmax (probability 1.0)
        with torch.no_grad():
            loaded.model.classifier.weight.div_(30)
    result = attribute(loaded, "I went to the store.", "She said that.", steps=6, rule="gauss-legendre")
    change = result.probability - result.zeroed
    assert np.abs(change).max() > 1e-4
    assert np.abs(result.completeness_gap).max() < 1e-3 * np.abs(change).max() + 1e-6
    layers, heads = loaded.num_layers, loaded.num_heads
    n = len(result.tokens)
    assert result.attribution.shape == result.attention.shape == (layers, heads, n, n)
    np.testing.assert_allclose(result.attention.sum(-1), 1.0, rtol=1e-5)


@pytest.fixture(scope="module")
def scaled_head_classifier() -> LoadedModel:
    """The default model with a fresh two-label head scaled up, so its probability is far from linear in
    the attention."""
    torch.manual_seed(0)
    loaded = load_model(classifier=True, labels=["negative", "positive"])
    with torch.no_grad():
        loaded.model.classifier.weight.mul_(50)
    return loaded


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "text_b"), [("A gripping, beautifully acted film.", None), ("A man.", "He is.")]
)
def test_completeness_within_the_quadrature_error(
    scaled_head_classifier: LoadedModel, text: str, text_b: str | None
) -> None:
    """Per example and layer: Gauss-Legendre sums to F(A) - F(0) to float rounding; the paper's Riemann
    sum misses by an error that about halves when the steps double (first order): the quadrature's."""
    exact = attribute(scaled_head_classifier, text, text_b, steps=10, rule="gauss-legendre")
    change = exact.probability - exact.zeroed
    assert np.abs(change).min() > 1e-3
    np.testing.assert_allclose(exact.completeness_gap, 0.0, atol=1e-5)
    coarse = attribute(scaled_head_classifier, text, text_b, steps=10).completeness_gap
    fine = attribute(scaled_head_classifier, text, text_b, steps=20).completeness_gap
    assert np.all(np.abs(coarse) > 1e-4)  # well above float rounding
    ratio = fine / coarse  # first order: about 1/2 once the steps are fine enough
    assert np.all((ratio > 0.35) & (ratio < 0.75)), ratio


def test_label_and_predicted(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    predicted = attribute(loaded, "I went to the store.", steps=2)
    other = "neg" if predicted.label == "pos" else "pos"
    given = attribute(loaded, "I went to the store.", label=other, steps=2)
    assert given.label == other and given.predicted == predicted.label == predicted.predicted
    assert given.probability == pytest.approx(1 - predicted.probability, abs=1e-6)
    with pytest.raises(BertologyError, match="no label 'maybe'"):
        attribute(loaded, "I went to the store.", label="maybe", steps=2)


def test_a_pruned_model_is_refused(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    prune_heads(loaded, {0: [1]})
    with pytest.raises(BertologyError, match="structurally pruned heads"):
        attribute(loaded, "I went to the store.", steps=2)


def test_importance_is_the_mean_of_each_examples_largest_attribution(
    tiny_model_dirs: dict[str, Path],
) -> None:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    texts = ["I went to the store.", "The quick brown fox jumps over the lazy dog."]
    labels = np.array([1, 0])
    importance = attribution_importance(loaded, LabelledTexts(texts, None, labels), steps=3)
    each = [
        attribute(loaded, text, label=int(label), steps=3).attribution
        for text, label in zip(texts, labels, strict=True)
    ]
    expected = np.mean([values.max(axis=(2, 3)) for values in each], axis=0)
    np.testing.assert_allclose(importance.scores, expected, rtol=1e-5)
    assert importance.examples == 2 and len(importance.to_frame()) == loaded.num_layers * loaded.num_heads
    order = importance.removal_order()
    assert importance.scores[order[0]] == importance.scores.min()


def test_attribution_tree_on_constructed_scores() -> None:
    """Five tokens, three layers, one head. Token 2 has the largest total attribution to other tokens (the
    root; the [CLS] row 0 does not count). Layer 2 (the top) links 2 -> 3; layer 1 links 2 -> 4 and 3 -> 1
    (at least 0.4 of its largest) but not 2 -> 0 (0.3); layer 0 links 1 -> 4 (4 already in the tree: no
    edge) and 4 -> 0. The [CLS] row never links, however large."""
    scores = np.zeros((3, 2, 5, 5))
    scores[2, 0, 2, 3] = 1.0
    scores[2, 1, 0, 1] = 9.0  # the [CLS] row: left out of the normalisation, the root and the edges
    scores[1, 0, 3, 1], scores[1, 1, 2, 4], scores[1, 0, 2, 0] = 1.0, 0.5, 0.3
    scores[0, 0, 1, 4], scores[0, 0, 4, 0], scores[0, 1, 4, 0] = 1.0, 0.4, 0.4  # heads are summed
    tree = attribution_tree(scores, 0.4)
    assert tree.root == 2
    assert tree.edges == [
        TreeEdge(2, 2, 3, 1.0),
        TreeEdge(1, 2, 4, 0.5),
        TreeEdge(1, 3, 1, 1.0),
        TreeEdge(0, 4, 0, 0.8),
    ]
    assert tree.depth == {2: 0, 3: 1, 4: 1, 1: 2, 0: 2}
    # a higher threshold drops 2 -> 4 in layer 1, so 4 joins in layer 0 through 1, and passes 0 on
    assert attribution_tree(scores, 0.6).edges == [
        TreeEdge(2, 2, 3, 1.0),
        TreeEdge(1, 3, 1, 1.0),
        TreeEdge(0, 1, 4, 1.0),
        TreeEdge(0, 4, 0, 0.8),
    ]
