"""One pipeline for both kinds of model: the same single-head sweep, importance and pruning curve, given a
classifier's task (accuracy) or a language model's (next-token cross-entropy), equal naive loops written
here (one unpadded sequence or example at a time, every head gated by a full forward pass).

Tolerances: the padded, batched pipeline against one unpadded sequence at a time: float32 losses (order 1
to 10) summed in other batches and orders, rtol 1e-5; a baseline from the same full passes, rel 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_models import tiny_classifier, tiny_grouped_query_llama

from bertology.corpus.encoding import encode
from bertology.corpus.segments import sample_corpus
from bertology.interventions.ablation import AblationResult, ablation_sweep
from bertology.interventions.curves import pruning_curve
from bertology.interventions.data import LabelledTexts
from bertology.interventions.gates import head_gates
from bertology.interventions.language_model import LanguageModelTask, TokenSequences
from bertology.interventions.task import ACCURACY, LOSS, ClassifierTask
from bertology.models.heads import HeadSelection
from bertology.models.loading import LoadedModel

TEXTS = ["The quick brown fox jumps over the lazy dog.", "I went to the store.", "Heads look back, often."]


def naive_loss(loaded: LoadedModel, data: TokenSequences, removed: HeadSelection) -> float:
    """Mean next-token -log p over every predicted token, one sequence at a time with ``removed`` gated."""
    total, count = 0.0, 0
    with torch.no_grad(), head_gates(loaded, removed):
        for ids in data.ids:
            tokens = torch.as_tensor(ids)[None]
            log_probs = torch.log_softmax(loaded.model(input_ids=tokens).logits[0, :-1].double(), -1)
            total -= float(log_probs[torch.arange(len(ids) - 1), tokens[0, 1:]].sum())
            count += len(ids) - 1
    return total / count


def naive_label(loaded: LoadedModel, text: str) -> int:
    """The classifier's arg-max label of ``text`` alone."""
    inputs = loaded.model_inputs(encode(loaded.tokenizer, [text], max_length=loaded.max_length))
    return int(loaded.model(**inputs).logits[0].argmax())


def naive_accuracy(loaded: LoadedModel, data: LabelledTexts, removed: HeadSelection) -> float:
    """Share of examples whose arg-max label is the gold one, one example at a time with ``removed`` gated."""
    with torch.no_grad(), head_gates(loaded, removed):
        right = [
            naive_label(loaded, text) == label for text, label in zip(data.texts, data.labels, strict=True)
        ]
    return sum(right) / len(data)


@pytest.fixture(scope="module")
def llama(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return tiny_grouped_query_llama(tiny_model_dirs["llama"])


def test_one_sweep_and_curve_serve_a_language_model(llama: LoadedModel) -> None:
    data = TokenSequences.of_corpus(llama, sample_corpus(), max_length=12, max_segments=3)
    task = LanguageModelTask(llama, data)
    heads = list(np.ndindex(llama.num_layers, llama.num_heads))
    expected = np.array([naive_loss(llama, data, {layer: [head]}) for layer, head in heads]).reshape(2, 4)
    result = ablation_sweep(task, batch_size=2)  # lower layers reused, padded batches of 2
    np.testing.assert_allclose(result.scores, expected, rtol=1e-5)
    assert result.baseline == pytest.approx(naive_loss(llama, data, {}), rel=1e-6)
    assert result.count == data.predicted_tokens and result.score.name == "loss"
    # the other path, a full pass per head, on one head per layer (the others' cells are NaN)
    some = ablation_sweep(task, heads=[(0, 2), (1, 1)], batch_size=2, reuse_lower_layers=False)
    assert np.isnan(some.scores).sum() == 6
    np.testing.assert_allclose(some.scores[[0, 1], [2, 1]], expected[[0, 1], [2, 1]], rtol=1e-5)
    # a loss is better low: the head whose removal leaves the lowest loss goes first
    assert result.removal_order()[0] == np.unravel_index(np.argmin(expected), expected.shape)
    assert np.ptp(expected) > 1e-3  # the heads matter unequally
    order = result.removal_order()[:3]
    curve = pruning_curve(task, order, [0, 3], batch_size=2)
    assert curve[1] == pytest.approx(naive_loss(llama, data, order), rel=1e-5)


def test_one_sweep_and_curve_serve_a_classifier(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    with torch.no_grad():
        labels = np.array([naive_label(loaded, text) for text in TEXTS])
    labels[0] = 1 - labels[0]  # one wrong gold label: the baseline accuracy is 2/3
    data = LabelledTexts(TEXTS, None, labels)
    task = ClassifierTask(loaded, data)
    heads = list(np.ndindex(loaded.num_layers, loaded.num_heads))
    expected = np.array([naive_accuracy(loaded, data, {layer: [head]}) for layer, head in heads])
    result = ablation_sweep(task, batch_size=2)
    np.testing.assert_array_equal(result.scores.ravel(), expected)
    assert result.baseline == 2 / 3 and result.count == 3 and result.score.name == "accuracy"
    curve = pruning_curve(task, heads[::2], [0, 6])
    assert curve[0] == 2 / 3 and curve[1] == naive_accuracy(loaded, data, heads[::2])


def test_removal_order_follows_the_direction_of_the_score() -> None:
    scores = np.array([[0.5, 0.9], [0.1, 0.7]])
    assert AblationResult(0.6, scores, 3, ACCURACY).removal_order() == [(0, 1), (1, 1), (0, 0), (1, 0)]
    assert AblationResult(0.6, scores, 3, LOSS).removal_order() == [(1, 0), (0, 0), (1, 1), (0, 1)]
