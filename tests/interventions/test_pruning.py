"""Structural pruning: a pruned model computes what the gated one does, is smaller, and saves and loads.

Tolerances: a structurally pruned model (smaller matrices) against the gated one: the same float32
arithmetic with some terms removed rather than multiplied by 0, so sums of other lengths and blocking:
rtol 1e-5 with atol 1e-6 for logits near 0; 1e-4 where many heads of one layer are removed (the projections'
shape changes most).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.errors import BertologyError
from bertology.interventions.data import LabelledTexts
from bertology.interventions.gates import head_gates
from bertology.interventions.pruning import count_parameters, prune_and_measure, prune_heads, save_model
from bertology.interventions.task import ClassifierTask
from bertology.models.classify import predict_logits
from bertology.models.loading import LoadedModel, load_model, wrap_model
from bertology.models.surgery import pruned_heads

TEXTS = ["The quick brown fox jumps over the lazy dog.", "She said, that the committee would publish it."]

#: Heads to remove, including every head of layer 1 (the layer then adds only its output bias).
HEADS = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}


def classifier(directory: Path | None) -> LoadedModel:
    torch.manual_seed(0)
    return load_model(directory, classifier=True, labels=["neg", "pos"])


def pruned_copy(loaded: LoadedModel, heads: dict[int, list[int]]) -> LoadedModel:
    return prune_heads(wrap_model(copy.deepcopy(loaded.model), loaded.tokenizer, "pruned"), heads)


def gated_logits(loaded: LoadedModel, heads: dict[int, list[int]]) -> np.ndarray:
    with head_gates(loaded, heads):
        return predict_logits(loaded, TEXTS)


@pytest.mark.parametrize("architecture", ["bert", "roberta", "xlm-roberta", "distilbert", "electra"])
def test_pruned_equals_gated_and_survives_saving(
    architecture: str, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    loaded = classifier(tiny_model_dirs[architecture])
    expected = gated_logits(loaded, HEADS)
    assert np.abs(expected - predict_logits(loaded, TEXTS)).max() > 1e-5  # the heads mattered
    pruned = pruned_copy(loaded, HEADS)
    np.testing.assert_allclose(predict_logits(pruned, TEXTS), expected, rtol=1e-5, atol=1e-6)

    # per removed head: query, key and value lose head_dim rows and biases, the output head_dim columns,
    # except that a layer with no head left keeps one head's (zero) weights.
    hidden = 32
    head_dim = hidden // 4
    per_head = 3 * (head_dim * hidden + head_dim) + hidden * head_dim
    assert count_parameters(loaded.model) - count_parameters(pruned.model) == per_head * (7 - 1)

    save_model(pruned, tmp_path / "run")
    reloaded = load_model(tmp_path / "run", classifier=True)
    assert pruned_heads(reloaded.model.config) == HEADS
    np.testing.assert_allclose(predict_logits(reloaded, TEXTS), expected, rtol=1e-5, atol=1e-6)
    assert count_parameters(reloaded.model) == count_parameters(pruned.model)


def test_pruning_the_default_model() -> None:
    loaded = classifier(None)
    heads = {layer: list(range(0, 12, layer + 1)) for layer in range(6)}
    expected = gated_logits(loaded, heads)
    np.testing.assert_allclose(
        predict_logits(pruned_copy(loaded, heads), TEXTS), expected, rtol=1e-4, atol=1e-6
    )


def test_pruning_in_steps_equals_pruning_at_once_and_gates_follow_the_kept_heads(
    tiny_model_dirs: dict[str, Path],
) -> None:
    loaded = classifier(tiny_model_dirs["bert"])
    once = pruned_copy(loaded, HEADS)
    steps = prune_heads(pruned_copy(loaded, {0: [3], 1: [1, 2]}), {0: [1], 1: [0, 3], 2: [2]})
    assert pruned_heads(steps.model.config) == HEADS
    np.testing.assert_allclose(
        predict_logits(steps, TEXTS), predict_logits(once, TEXTS), rtol=1e-5, atol=1e-6
    )
    # gating a head the pruned model kept (original numbering) = gating it in the unpruned model
    with head_gates(once, {0: [2]}):
        pruned_and_gated = predict_logits(once, TEXTS)
    expected = gated_logits(loaded, {**HEADS, 0: [1, 2, 3]})
    np.testing.assert_allclose(pruned_and_gated, expected, rtol=1e-5, atol=1e-6)


def test_albert_cannot_be_pruned(tiny_model_dirs: dict[str, Path]) -> None:
    with pytest.raises(BertologyError, match="ALBERT shares one set of attention weights"):
        pruned_copy(classifier(tiny_model_dirs["albert"]), {0: [1]})


def test_prune_and_measure_reports_both_models(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = classifier(tiny_model_dirs["bert"])
    data = LabelledTexts(TEXTS, None, np.array([0, 1]))
    before = copy.deepcopy(loaded.model.state_dict())
    pruned, outcome = prune_and_measure(ClassifierTask(loaded, data), HEADS, repeats=1)
    assert all(torch.equal(before[name], value) for name, value in loaded.model.state_dict().items())
    assert outcome.removed == 7 and outcome.total_heads == 12
    assert outcome.parameters == count_parameters(pruned.model) < outcome.baseline_parameters
    assert outcome.seconds > 0 and outcome.speedup == outcome.baseline_seconds / outcome.seconds
    assert outcome.to_dict()["removed"] == {"0": [1, 3], "1": [0, 1, 2, 3], "2": [2]}
    # The pruned copy computes what gating computes (float rounding only), and the scores are the accuracies
    # of the two models' own predictions.
    assert outcome.largest_difference < 1e-5 and outcome.value == outcome.gated
    right = [predict_logits(model, TEXTS).argmax(-1) == data.labels for model in (pruned, loaded)]
    assert (outcome.value, outcome.baseline) == (right[0].mean(), right[1].mean())
    # Key/value heads computed: layer 0 keeps 2, layer 1 a zeroed slot (a layer keeps one), layer 2 keeps 3.
    assert not outcome.grouped and (outcome.key_value_heads, outcome.total_key_value_heads) == (6, 12)
    summary = outcome.to_dict()
    assert (summary["score_name"], summary["higher_is_better"]) == ("accuracy", True)
    assert summary["baseline_accuracy"] == summary["baseline_score"] == outcome.baseline
