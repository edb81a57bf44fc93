"""Mean and resample ablation: the sweeps equal replacements built here by a plain forward pre-hook on the
output projection; the choice of resample sources; a replacement put in by hand through the gates.

Tolerances: sweeps against a forward pre-hook written here: the same float32 loss with the lower layers
reused or recomputed and padded batches of other sizes, so matmul sums reordered: rtol 1e-5 on losses of
order 1 to 10 (a few units of 2^-24 per layer); logits through the gates against a hook, rtol 1e-4 with atol
1e-5 (logits near 0 carry the absolute part).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.tiny_models import (
    gpt2_output_projections,
    llama_output_projections,
    tiny_classifier,
    tiny_grouped_query_llama,
    tiny_language_model,
)
from typer.testing import CliRunner

from bertology import BertologyError
from bertology.cli import app
from bertology.corpus.encoding import encode
from bertology.corpus.segments import sample_corpus
from bertology.interventions.ablation import ablation_sweep, sweep_outputs
from bertology.interventions.data import LabelledTexts
from bertology.interventions.gates import head_gates, record_head_outputs
from bertology.interventions.language_model import LanguageModelTask, TokenSequences
from bertology.interventions.replacement import resample_sources
from bertology.interventions.task import ClassifierTask
from bertology.models.loading import LoadedModel, load_model

TEXTS = ["The quick brown fox jumps over the lazy dog.", "I went to the store.", "Heads look back."]


@pytest.fixture(scope="module")
def llama(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return tiny_grouped_query_llama(tiny_model_dirs["llama"])


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def decoder(
    request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path]
) -> tuple[LoadedModel, list[torch.nn.Module]]:
    """A tiny decoder of 2 layers of 4 heads of 8 features (grouped-query llama, GPT-2 with its Conv1D
    projections) and its output projections."""
    if request.param == "gpt2":
        loaded = tiny_language_model(tiny_model_dirs["gpt2"])
        return loaded, gpt2_output_projections(loaded)
    loaded = tiny_grouped_query_llama(tiny_model_dirs["llama"])
    return loaded, llama_output_projections(loaded)


@pytest.fixture(scope="module")
def bert(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return tiny_classifier(tiny_model_dirs["bert"])


def bert_projections(loaded: LoadedModel) -> list[torch.nn.Module]:
    return [layer.attention.output.dense for layer in loaded.model.bert.encoder.layer]


@contextmanager
def pre_hooks(projections: list[torch.nn.Module], hook: Callable[..., object]) -> Iterator[None]:
    """``hook(layer, args)`` as a forward pre-hook on each layer's output projection."""
    handles = [
        projection.register_forward_pre_hook(lambda _, args, layer=layer: hook(layer, args))
        for layer, projection in enumerate(projections)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def inputs_seen(projections: list[torch.nn.Module], run: Callable[[], object]) -> list[torch.Tensor]:
    """Per layer, what entered the output projection during ``run()`` (one call per layer)."""
    seen: list[torch.Tensor] = [torch.empty(0)] * len(projections)

    def keep(layer: int, args: tuple[torch.Tensor, ...]) -> None:
        seen[layer] = args[0].detach().clone()

    with pre_hooks(projections, keep):
        run()
    return seen


def replaced_head(layer: int, head: int, head_dim: int, values: torch.Tensor) -> Callable[..., object]:
    """A pre-hook putting ``values`` (broadcast to [batch, tokens, head_dim]) in head ``(layer, head)``."""

    def hook(at: int, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        if at != layer:
            return None
        changed = args[0].clone()
        span = slice(head * head_dim, (head + 1) * head_dim)
        changed[..., span] = values[..., span].expand_as(changed[..., span])
        return (changed, *args[1:])

    return hook


def sequence_loss(loaded: LoadedModel, ids: np.ndarray) -> tuple[float, int]:
    """Summed next-token -log p of one sequence (no padding) and its count."""
    tokens = torch.as_tensor(ids)[None]
    logits = loaded.model(input_ids=tokens, use_cache=False).logits[0, :-1]
    log_probs = torch.log_softmax(logits.double(), -1)
    return float(-log_probs[torch.arange(len(ids) - 1), tokens[0, 1:]].sum()), len(ids) - 1


def test_mean_ablation_of_a_decoder_equals_the_mean_put_in_by_hand(
    decoder: tuple[LoadedModel, list[torch.nn.Module]],
) -> None:
    llama, projections = decoder
    data = TokenSequences.of_texts(llama, TEXTS)
    assert len({len(ids) for ids in data.ids}) > 1  # unequal lengths: the mean over every token
    with torch.no_grad():
        seen = [inputs_seen(projections, lambda ids=ids: sequence_loss(llama, ids)) for ids in data.ids]
        means = [torch.cat([run[layer][0] for run in seen]).mean(0) for layer in range(2)]
        expected = np.empty((2, 4))
        for layer, head in np.ndindex(2, 4):
            with pre_hooks(projections, replaced_head(layer, head, 8, means[layer])):
                losses = [sequence_loss(llama, ids) for ids in data.ids]
            expected[layer, head] = sum(loss for loss, _ in losses) / sum(count for _, count in losses)
    ablation = ablation_sweep(LanguageModelTask(llama, data), ablation="mean", batch_size=3)
    np.testing.assert_allclose(ablation.scores, expected, rtol=1e-5)
    zero = ablation_sweep(LanguageModelTask(llama, data), batch_size=3)
    assert np.abs(ablation.scores - zero.scores).max() > 1e-4  # mean is not zero


def test_mean_ablation_is_per_position_for_equal_lengths(
    decoder: tuple[LoadedModel, list[torch.nn.Module]],
) -> None:
    llama, projections = decoder
    ids = np.random.default_rng(0).integers(3, llama.model.config.vocab_size, (3, 9))
    data = TokenSequences.of_ids(ids)
    with torch.no_grad():
        seen = inputs_seen(projections, lambda: llama.model(input_ids=torch.as_tensor(ids), use_cache=False))
        expected = np.empty((2, 4))
        for layer, head in np.ndindex(2, 4):
            mean = seen[layer].mean(0)  # [tokens, features]
            with pre_hooks(projections, replaced_head(layer, head, 8, mean)):
                losses = [sequence_loss(llama, row) for row in ids]
            expected[layer, head] = sum(loss for loss, _ in losses) / sum(count for _, count in losses)
    replacement = LanguageModelTask(llama, data).replacement("mean")
    assert replacement.per_position and "at each position" in replacement.description
    ablation = ablation_sweep(LanguageModelTask(llama, data), ablation="mean")
    np.testing.assert_allclose(ablation.scores, expected, rtol=1e-5)


def test_resample_ablation_of_a_decoder_equals_the_other_output_put_in_by_hand(
    decoder: tuple[LoadedModel, list[torch.nn.Module]],
) -> None:
    llama, projections = decoder
    ids = np.random.default_rng(1).integers(3, llama.model.config.vocab_size, (3, 7))
    data = TokenSequences.of_ids(ids)
    sources = LanguageModelTask(llama, data).replacement("resample", seed=3).sources
    with torch.no_grad():
        seen = [inputs_seen(projections, lambda row=row: sequence_loss(llama, row)) for row in ids]
        expected = np.empty((2, 4))
        for layer, head in np.ndindex(2, 4):
            total = 0.0
            for row, source in enumerate(sources):
                with pre_hooks(projections, replaced_head(layer, head, 8, seen[source][layer])):
                    total += sequence_loss(llama, ids[row])[0]
            expected[layer, head] = total / (3 * 6)
    ablation = ablation_sweep(LanguageModelTask(llama, data), ablation="resample", seed=3, batch_size=2)
    np.testing.assert_allclose(ablation.scores, expected, rtol=1e-5)


def classifier_logits(loaded: LoadedModel, texts: list[str]) -> torch.Tensor:
    encoded = encode(loaded.tokenizer, texts, max_length=loaded.max_length)
    return loaded.model(**loaded.model_inputs(encoded)).logits


def test_classifier_ablation_kinds_equal_replacements_by_hand(bert: LoadedModel) -> None:
    data = LabelledTexts(TEXTS, None, np.zeros(len(TEXTS), dtype=np.int64))
    projections = bert_projections(bert)
    head_dim = bert.model.config.hidden_size // bert.num_heads
    with torch.no_grad():
        seen = [inputs_seen(projections, lambda text=text: classifier_logits(bert, [text])) for text in TEXTS]
        means = [torch.cat([run[layer][0] for run in seen]).mean(0) for layer in range(bert.num_layers)]
        task = ClassifierTask(bert, data)
        sources = task.replacement("resample", seed=5).sources
        for kind in ("mean", "resample"):
            replacement = task.replacement(kind, seed=5)
            _, swept = sweep_outputs(
                task, lambda logits, *_: logits.float(), batch_size=2, replacement=replacement
            )
            logits = swept.reshape(bert.num_layers, bert.num_heads, *swept.shape[1:])
            for layer, head in np.ndindex(bert.num_layers, bert.num_heads):
                for row, text in enumerate(TEXTS):
                    length = len(seen[row][0][0])
                    if kind == "mean":
                        values = means[layer]
                    else:
                        other = seen[sources[row]][layer][0]
                        fill = other.mean(0, keepdim=True).expand(max(length - len(other), 0), -1)
                        values = torch.cat([other, fill])[:length]
                    with pre_hooks(projections, replaced_head(layer, head, head_dim, values)):
                        expected = classifier_logits(bert, [text])[0]
                    np.testing.assert_allclose(
                        logits[layer, head, row], expected.numpy(), rtol=1e-4, atol=1e-5
                    )


def test_resample_sources_are_other_inputs_at_least_as_long_where_possible() -> None:
    lengths = [5, 3, 5, 9, 3, 4]
    sources = resample_sources(lengths, seed=0)
    assert all(source != row for row, source in enumerate(sources))
    for row, source in enumerate(sources):
        assert lengths[source] >= lengths[row] or row == 3  # 9 is the longest: any other input
    assert sources[3] != 3
    np.testing.assert_array_equal(sources, resample_sources(lengths, seed=0))
    draws = {tuple(resample_sources(lengths, seed=seed)) for seed in range(10)}
    assert len(draws) > 1  # the seed matters
    with pytest.raises(BertologyError, match="at least two inputs"):
        resample_sources([4], seed=0)


def test_gates_put_a_recorded_output_in_a_heads_place(bert: LoadedModel) -> None:
    """Gate 0 with another input's recorded outputs = that head's output copied across by a plain hook."""
    projections = bert_projections(bert)
    head_dim = bert.model.config.hidden_size // bert.num_heads
    texts = ["a b c d", "e f g h"]  # the same token count
    encoded = encode(bert.tokenizer, texts, max_length=bert.max_length)
    inputs = bert.model_inputs(encoded)
    with torch.no_grad():
        recorded = record_head_outputs(bert, inputs)
        swapped = [values.flip(0) for values in recorded]  # each input takes the other's
        with head_gates(bert, {(1, 0)}, replacement=swapped):
            patched = bert.model(**inputs).logits
        seen = inputs_seen(projections, lambda: bert.model(**inputs))
        with pre_hooks(projections, replaced_head(1, 0, head_dim, seen[1].flip(0))):
            expected = bert.model(**inputs).logits
    for layer in range(bert.num_layers):
        torch.testing.assert_close(recorded[layer], seen[layer])
    torch.testing.assert_close(patched, expected)


def test_an_unknown_ablation_is_one_sentence(llama: LoadedModel) -> None:
    data = TokenSequences.of_ids([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(BertologyError, match="must be one of zero, mean, resample, not 'half'"):
        ablation_sweep(LanguageModelTask(llama, data), ablation="half")


def test_ablate_command_with_mean_ablation_of_a_language_model(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    output = tmp_path / "mean"
    arguments = [
        "ablate",
        str(tiny_model_dirs["qwen2"]),
        "--lm-corpus",
        str(sample_corpus()),
        "-o",
        str(output),
    ]
    options = ["--max-segments", "3", "--max-len", "20", "--prune", "0", "--ablation", "mean"]
    torch.manual_seed(0)  # the tiny model's language-modelling head is drawn at loading
    result = CliRunner().invoke(app, [*arguments, *options])
    assert result.exit_code == 0, result.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ablation"].startswith("mean: a removed head's output is its mean over the 3 inputs")
    torch.manual_seed(0)
    loaded = load_model(tiny_model_dirs["qwen2"], language_model=True)
    data = TokenSequences.of_corpus(loaded, sample_corpus(), max_length=20, max_segments=3)
    expected = ablation_sweep(LanguageModelTask(loaded, data), ablation="mean").scores.ravel()
    np.testing.assert_allclose(pd.read_csv(output / "ablation.csv")["loss"], expected, rtol=1e-5)
    assert summary["ablation"] in html.unescape((output / "report.html").read_text())


def test_ablate_command_with_resample_ablation_of_a_classifier(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    loaded.model.save_pretrained(run / "model")
    loaded.tokenizer.save_pretrained(run / "model")
    task = tmp_path / "task"
    task.mkdir()
    rows = "".join(f"{text}\t{label}\n" for text, label in zip(TEXTS, ["neg", "pos", "neg"], strict=True))
    for name in ("train.tsv", "dev.tsv"):
        (task / name).write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    output = tmp_path / "resample"
    arguments = ["ablate", str(run), "--task", str(task), "-o", str(output), "--prune", "0"]
    options = ["--attribution-examples", "0", "--ablation", "resample", "--seed", "4"]
    result = CliRunner().invoke(app, [*arguments, *options])
    assert result.exit_code == 0, result.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ablation"].startswith(
        "resample: a removed head's output is its output on another of the 3"
    )
    assert "(seed 4)" in summary["ablation"]
    data = LabelledTexts(TEXTS, None, np.array([0, 1, 0]))
    task = ClassifierTask(loaded, data)
    expected = ablation_sweep(task, ablation="resample", seed=4, batch_size=32).scores.ravel()
    np.testing.assert_array_equal(pd.read_csv(output / "ablation.csv")["accuracy"], expected)


def test_ablate_refuses_an_unknown_ablation_in_one_sentence(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    arguments = ["ablate", str(tiny_model_dirs["qwen2"]), "--lm-corpus", str(sample_corpus())]
    result = CliRunner().invoke(app, [*arguments, "-o", str(tmp_path / "a"), "--ablation", "half"])
    assert result.exit_code == 2 and "Invalid value for '--ablation'" in result.output
    assert "'half' is not one of" in result.output
    ray = CliRunner().invoke(
        app, [*arguments, "-o", str(tmp_path / "b"), "--ablation", "mean", "--ray", "local"]
    )
    assert ray.exit_code == 2 and "run here only" in ray.output
