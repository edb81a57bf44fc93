"""Single-head ablation (fast sweep = naive loop), importance, pruning curves, attention gradients and the
``ablate`` command.

Tolerances: the fast sweep (lower layers reused) against full passes: rtol 1e-5, atol 1e-6 (float32 sums
reordered); importance against central differences of the float64 loss (the model in float64): rtol 1e-5
with atol 1e-9 (the difference's truncation error is second order in its step); attention gradients
against per-category means computed here: rtol 1e-4 (float32 gradients summed in another order).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.tiny_models import tiny_classifier
from torch.nn.functional import cross_entropy
from transformers import BertForMaskedLM
from typer.testing import CliRunner

from bertology.cli import app
from bertology.corpus.encoding import encode
from bertology.interventions.ablation import ablation_sweep, sweep_outputs
from bertology.interventions.attention_gradients import attention_gradients
from bertology.interventions.curves import pruning_curve, removal_counts
from bertology.interventions.data import LabelledTexts
from bertology.interventions.gates import head_gates
from bertology.interventions.importance import head_importance
from bertology.interventions.task import ClassifierTask, Inputs
from bertology.models.loading import LoadedModel, load_model, wrap_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "She said that, the committee would publish.",
    "Attention heads often look at the previous token.",
    "Unbelievably, the tokenizer splits words.",
    "I went to the store.",
    "Researchers measured how much each head attends to punctuation, and separators.",
]

#: The first rows of SST-2's dev set (sentence, label).
SST2_ROWS = [
    ("it 's a charming and often affecting journey . ", "1"),
    ("unflinchingly bleak and desperate ", "0"),
    ("allows us to hope that nolan is poised to embark a major career as a commercial yet inventive "
     "filmmaker . ", "1"),
    ("the acting , costumes , music , cinematography and sound are all astounding given the production 's "
     "austere locales . ", "1"),
    ("it 's slow -- very , very slow . ", "0"),
    ("although laced with humor and a few fanciful touches , the film is a refreshingly serious look at "
     "young women . ", "1"),
    ("a sometimes tedious film . ", "0"),
    ("or doing last year 's taxes with your ex-wife . ", "0"),
]  # fmt: skip


def logits(values: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
    """What :func:`sweep_outputs` keeps of each example: its logits."""
    return values.float()


def labelled(loaded: LoadedModel, texts: list[str]) -> LabelledTexts:
    """``texts`` labelled with the model's own predictions with every head (baseline accuracy 1)."""
    encoded = encode(loaded.tokenizer, texts, max_length=loaded.max_length)
    with torch.inference_mode():
        logits = loaded.model(**loaded.model_inputs(encoded)).logits
    return LabelledTexts(texts, None, logits.argmax(-1).numpy())


@pytest.mark.parametrize("architecture", ["bert", "roberta", "albert", "distilbert"])
def test_reusing_lower_layers_gives_the_naive_logits(
    architecture: str, tiny_model_dirs: dict[str, Path]
) -> None:
    loaded = tiny_classifier(tiny_model_dirs[architecture])
    data = labelled(loaded, TEXTS)
    task = ClassifierTask(loaded, data)
    fast_baseline, fast = sweep_outputs(task, logits, batch_size=4)
    slow_baseline, slow = sweep_outputs(task, logits, batch_size=4, reuse_lower_layers=False)
    np.testing.assert_allclose(fast_baseline, slow_baseline, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-6)
    assert np.abs(slow - slow_baseline).max() > 1e-4  # removing heads changes the logits
    assert fast.shape == (loaded.num_layers * loaded.num_heads, len(TEXTS), 2)


def test_sweep_accuracies_equal_the_naive_loop_on_the_default_model() -> None:
    torch.manual_seed(0)
    loaded = load_model(classifier=True, labels=["0", "1"])
    data = LabelledTexts([text for text, _ in SST2_ROWS[:3]], None, np.array([1, 0, 1]))
    done: list[int] = []
    task = ClassifierTask(loaded, data)
    fast = ablation_sweep(task, batch_size=2, on_progress=lambda count, total: done.append(count))
    slow = ablation_sweep(task, batch_size=2, reuse_lower_layers=False)
    assert fast.baseline == slow.baseline
    np.testing.assert_array_equal(fast.scores, slow.scores)
    assert done[-1] == 72 * 3
    frame = fast.to_frame()
    assert list(frame.columns) == ["layer", "head", "accuracy", "change"]
    np.testing.assert_allclose(frame["change"], frame["accuracy"] - fast.baseline)
    assert fast.count == 3


def test_importance_equals_finite_differences(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    loaded.model.double()
    data = LabelledTexts(TEXTS[:3], None, np.array([0, 1, 1]))
    importance = head_importance(ClassifierTask(loaded, data), batch_size=2)

    layers, heads, step = loaded.num_layers, loaded.num_heads, 1e-5
    expected = np.zeros((layers, heads))
    for text, label in zip(data.texts, data.labels, strict=True):
        inputs = loaded.model_inputs(encode(loaded.tokenizer, [text], max_length=64))

        def loss(gates: torch.Tensor, inputs: dict[str, torch.Tensor] = inputs, label: int = label) -> float:
            with torch.inference_mode(), head_gates(loaded, gates):
                return float(cross_entropy(loaded.model(**inputs).logits, torch.tensor([label])))

        for layer in range(layers):
            for head in range(heads):
                up, down = (
                    torch.ones(layers, heads, dtype=torch.float64),
                    torch.ones(layers, heads, dtype=torch.float64),
                )
                up[layer, head], down[layer, head] = 1 + step, 1 - step
                expected[layer, head] += abs(loss(up) - loss(down)) / (2 * step) / len(data)
    np.testing.assert_allclose(importance.raw, expected, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(importance.normalized, axis=1), 1.0)
    order = importance.removal_order()
    assert importance.normalized[order[0]] == importance.normalized.min()


def test_removal_counts() -> None:
    assert removal_counts(144) == [0, 3, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 144]
    assert removal_counts(12) == [0, 3, 10, 12]


def test_pruning_curve_ends_are_the_full_and_the_headless_model(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = tiny_classifier(tiny_model_dirs["electra"])
    data = labelled(loaded, TEXTS)
    order = [(layer, head) for layer in range(3) for head in range(4)]
    curve = pruning_curve(ClassifierTask(loaded, data), order, [0, 12])
    assert curve[0] == 1.0  # the labels are the full model's predictions
    with head_gates(loaded, torch.zeros(3, 4)):
        headless = labelled(loaded, TEXTS).labels
    assert curve[1] == np.mean(headless == data.labels)


def _category_means(loaded: LoadedModel, texts: list[str], labels: np.ndarray) -> np.ndarray:
    """[layers, heads, 3] mean |dL/dA| to [SEP], punctuation and other keys, from the attentions that
    transformers returns with ``output_attentions=True``."""
    encoded = encode(loaded.tokenizer, texts, max_length=loaded.max_length)
    outputs = loaded.model(**loaded.model_inputs(encoded), output_attentions=True)
    loss = cross_entropy(outputs.logits, torch.as_tensor(labels), reduction="sum")
    gradients = torch.stack(torch.autograd.grad(loss, outputs.attentions), dim=1).abs()  # [B, L, H, N, N]
    sums, counts = np.zeros((loaded.num_layers, loaded.num_heads, 3)), np.zeros(3)
    for row, tokens in enumerate(encoded.tokens):
        n = len(tokens)
        category = [0 if t == loaded.tokenizer.sep_token else 1 if t in (".", ",") else 2 for t in tokens]
        for key, kind in enumerate(category):
            sums[:, :, kind] += gradients[row, :, :, :n, key].sum(-1).numpy()
            counts[kind] += n
    return sums / counts


def test_attention_gradients_match_transformers_attentions(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    data = LabelledTexts(TEXTS[:4], None, np.array([0, 1, 1, 0]))
    result = attention_gradients(loaded, data, batch_size=3)
    assert result.loss == "task"
    np.testing.assert_allclose(result.per_head, _category_means(loaded, data.texts, data.labels), rtol=1e-4)
    assert result.to_frame().shape == (12, 5)
    np.testing.assert_allclose(result.per_layer, result.per_head.mean(1))


def test_attention_gradients_use_the_masked_lm_loss(tiny_model_dirs: dict[str, Path]) -> None:
    bare = load_model(tiny_model_dirs["bert"])
    torch.manual_seed(0)
    masked_lm = wrap_model(BertForMaskedLM(bare.model.config), bare.tokenizer, "mlm")
    data = LabelledTexts(TEXTS, None, np.zeros(len(TEXTS), dtype=np.int64))
    result = attention_gradients(masked_lm, data, seed=1)
    assert result.loss == "mlm"
    assert np.isfinite(result.per_head).all() and (result.per_head > 0).all()
    assert np.array_equal(attention_gradients(masked_lm, data, seed=1).per_head, result.per_head)


@pytest.fixture(scope="module")
def sst2_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    task = tmp_path_factory.mktemp("SST-2")
    rows = "".join(f"{sentence}\t{label}\n" for sentence, label in SST2_ROWS)
    for name in ("train.tsv", "dev.tsv"):
        (task / name).write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    return task


def test_ablate_command_writes_every_result(classifier_run: Path, sst2_task: Path, tmp_path: Path) -> None:
    output = tmp_path / "ablation"
    arguments = ["ablate", str(classifier_run), "--task", str(sst2_task), "--max-dev", "6", "-o", str(output)]
    result = CliRunner().invoke(app, [*arguments, "--attribution-examples", "2"])
    assert result.exit_code == 0, result.output
    assert "Dev accuracy" in result.output and "Pruned 36 heads" in result.output
    ablation = pd.read_csv(output / "ablation.csv")
    assert len(ablation) == 72 and set(ablation.columns) == {"layer", "head", "accuracy", "change"}
    assert len(pd.read_csv(output / "importance.csv")) == 72
    curve = pd.read_csv(output / "pruning_curve.csv")
    assert curve["heads_removed"].tolist() == [0, 3, 10, 20, 30, 40, 50, 60, 70, 72]
    assert curve["accuracy_by_ablation"][0] == curve["accuracy_by_importance"][0]
    assert (
        curve["accuracy_by_attribution"][0]
        == curve["accuracy_at_random"][0]
        == curve["accuracy_by_ablation"][0]
    )
    attribution = pd.read_csv(output / "attribution_importance.csv")
    assert len(attribution) == 72 and (attribution["attribution"] != 0).any()
    gradients = pd.read_csv(output / "attention_gradients.csv")
    assert list(gradients.columns) == ["layer", "head", "sep", "punct", "other"]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["pruning"]["heads_removed"] == 36 and summary["dev examples"] == 6
    for name in ("ablation", "importance", "pruning_curve", "attention_gradients", "attribution"):
        assert (output / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    report = (output / "report.html").read_text()
    assert "Single-head ablation" in report and "Structural pruning" in report
    assert "Self-attention attribution" in report and "2 dev examples" in report

    pruned = load_model(output / "pruned", classifier=True)
    removed = {int(layer): heads for layer, heads in summary["pruning"]["removed"].items()}
    assert sum(len(heads) for heads in removed.values()) == 36
    original = load_model(classifier_run, classifier=True)
    texts = [sentence for sentence, _ in SST2_ROWS]
    with head_gates(original, removed):
        gated = labelled(original, texts)
    assert np.array_equal(labelled(pruned, texts).labels, gated.labels)
