"""`bertology compare`: cross-model head distances, the matching, the per-head frame, files and CLI.

Tolerances: JS divergences of float32 rows (logarithms of weights near 0 magnify their rounding) summed in
chunks against a float64 reference over rows: atol 2e-5, rtol 1e-4; word rows (sums of float32 piece
weights) sum to 1 within 1e-5.
"""

from __future__ import annotations

import copy
import html
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.tiny_models import save_tiny_model
from transformers import BertConfig, BertModel
from typer.testing import CliRunner

from bertology.analysis.comparison import HeadMatching, compare_models, first_segment, word_rows
from bertology.analysis.distances import js_cross_sums
from bertology.analysis.settings import AnalysisSettings
from bertology.attention.capturing import capture
from bertology.attention.words import word_attention
from bertology.cli import app
from bertology.corpus.segments import iter_segments
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, load_model, wrap_model
from bertology.report.comparison import changed_heading, relative_depth
from bertology.training.compare import js_divergence_rows

SST2_ROWS = [
    ("a gorgeous , witty , seductive movie .", "1"),
    ("the story is bogus and its characters are dull .", "0"),
    ("an utterly charming and hilarious film .", "1"),
    ("it 's a mess , plain and simple .", "0"),
]


@pytest.fixture(scope="module")
def corpus(sample_corpus_head: Callable[[int], Path]) -> Path:
    return sample_corpus_head(20)


@pytest.fixture(scope="module")
def self_comparison(default_model: LoadedModel, corpus: Path):
    return compare_models(default_model, default_model, corpus, AnalysisSettings(limit=4, batch_size=3))


def delta_columns(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[[name for name in frame.columns if name.endswith("_delta")]]


def swap_heads(loaded: LoadedModel, layer: int, first: int, second: int) -> LoadedModel:
    """A copy of a BERT model whose heads ``first`` and ``second`` of ``layer`` trade places: the rows of the
    query, key and value projections and the columns of the output projection are permuted."""
    model = copy.deepcopy(loaded.model)
    size = model.config.hidden_size // model.config.num_attention_heads
    order = torch.arange(model.config.hidden_size)
    block_a, block_b = (
        order[first * size : (first + 1) * size].clone(),
        order[second * size : (second + 1) * size],
    )
    order[first * size : (first + 1) * size] = block_b
    order[second * size : (second + 1) * size] = block_a
    attention = model.encoder.layer[layer].attention
    with torch.no_grad():
        for projection in (attention.self.query, attention.self.key, attention.self.value):
            projection.weight.copy_(projection.weight[order])
            projection.bias.copy_(projection.bias[order])
        attention.output.dense.weight.copy_(attention.output.dense.weight[:, order])
    return wrap_model(model, loaded.tokenizer, "swapped")


def small_bert(layers: int, heads: int, tokenizer: object, name: str) -> LoadedModel:
    torch.manual_seed(1)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,  # type: ignore[attr-defined]
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return wrap_model(BertModel(config), tokenizer, name)  # type: ignore[arg-type]


def test_cross_sums_equal_the_double_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    left = torch.softmax(torch.randn(5, 7, 9, generator=generator) * 3, -1)
    right = torch.softmax(torch.randn(30, 7, 9, generator=generator) * 3, -1)
    right[3] = left[1]  # identical rows: distance 0
    expected = np.array([[js_divergence_rows(a.numpy(), b.numpy()).sum() for b in right] for a in left])
    found = js_cross_sums(left.flatten(1), right.flatten(1), chunk_elements=500).numpy()
    np.testing.assert_allclose(found, expected, atol=2e-5, rtol=1e-4)
    assert found[1, 3] < 1e-5 and (found >= 0).all()
    with pytest.raises(BertologyError, match="same tokens"):
        js_cross_sums(left.flatten(1), right[:, :, :4].flatten(1))


def test_matching_is_optimal_and_rectangular_when_head_counts_differ() -> None:
    distance = np.array([[0.5, 0.1, 0.9], [0.2, 0.3, 0.8]])
    matching = HeadMatching.of(distance)
    assert matching.b_of_a.tolist() == [1, 0] and matching.a_of_b.tolist() == [1, 0, -1]
    assert matching.nearest_b.tolist() == [1, 0] and matching.nearest_a.tolist() == [1, 0, 1]
    np.testing.assert_allclose(matching.matched_distance, [0.1, 0.2])
    # Greedy nearest heads would collide; the assignment gives each B head one A head.
    collide = HeadMatching.of(np.array([[0.1, 0.2], [0.15, 0.9]]))
    assert collide.b_of_a.tolist() == [1, 0] and collide.nearest_b.tolist() == [0, 0]
    assert not collide.is_identity()


def test_a_model_against_itself_has_zero_differences_and_the_identity_matching(self_comparison) -> None:
    comparison = self_comparison
    assert comparison.level == "token" and comparison.a.segments == 4
    assert comparison.one_design and changed_heading(comparison, 5)[0] == "Most changed heads"
    assert comparison.matching.is_identity()
    distance = comparison.matching.distance
    assert np.diag(distance).max() < 1e-6  # zero up to float32 rounding
    assert distance[~np.eye(len(distance), dtype=bool)].min() > 1e-3
    frame = comparison.to_frame()
    assert len(frame) == 72
    deltas = delta_columns(frame).to_numpy(dtype=float)
    assert np.nanmax(np.abs(deltas)) == 0.0
    assert (frame["label_a"] == frame["label_b"]).all()
    for name in comparison.statistics:
        undefined = np.isnan(comparison.a.surface[name])
        np.testing.assert_array_equal(comparison.position_delta(name), np.where(undefined, np.nan, 0.0))
    assert json.loads(comparison.to_json())["b_of_a"] == list(range(72))


def test_swapped_heads_are_matched_back(default_model: LoadedModel, corpus: Path) -> None:
    swapped = swap_heads(default_model, layer=2, first=3, second=7)
    comparison = compare_models(default_model, swapped, corpus, AnalysisSettings(limit=3))
    expected = np.arange(72)
    expected[[2 * 12 + 3, 2 * 12 + 7]] = [2 * 12 + 7, 2 * 12 + 3]
    assert comparison.matching.b_of_a.tolist() == expected.tolist()
    assert np.nanmax(comparison.matching.matched_distance) < 1e-5
    frame = comparison.to_frame()
    assert np.nanmax(np.abs(delta_columns(frame).to_numpy(dtype=float))) < 1e-5
    assert (frame["label_a"] == frame["label_b"]).all()
    # Head by head (same numbers) the two swapped heads differ, and nothing else does.
    changed = np.abs(comparison.position_delta("previous")) > 1e-4
    assert set(zip(*np.nonzero(changed), strict=True)) <= {(2, 3), (2, 7)} and changed.any()


def test_norm_based_comparison_matches_swapped_heads_back(default_model: LoadedModel, corpus: Path) -> None:
    """Norm-based weights follow a head's value and output weights, so swapping two heads' weights swaps
    their norm-based weights too."""
    swapped = swap_heads(default_model, layer=2, first=3, second=7)
    comparison = compare_models(default_model, swapped, corpus, AnalysisSettings(limit=2, weights="norm"))
    assert comparison.a.weights == comparison.b.weights == "norm"
    expected = np.arange(72)
    expected[[2 * 12 + 3, 2 * 12 + 7]] = [2 * 12 + 7, 2 * 12 + 3]
    assert comparison.matching.b_of_a.tolist() == expected.tolist()
    assert np.nanmax(comparison.matching.matched_distance) < 1e-5
    plain = compare_models(default_model, swapped, corpus, AnalysisSettings(limit=2))
    assert not np.allclose(comparison.a.surface["cls"], plain.a.surface["cls"], atol=1e-3)


def test_cross_distances_equal_a_direct_computation(default_model: LoadedModel, corpus: Path) -> None:
    """Every token of two segments, against an independent per-pair JS over the captured attention."""
    other = small_bert(2, 4, default_model.tokenizer, "bert-2x4")
    comparison = compare_models(
        default_model, other, corpus, AnalysisSettings(limit=2, js_tokens_per_segment=None)
    )
    assert comparison.level == "token"
    total, tokens = np.zeros((72, 8)), 0
    for segment in list(iter_segments(corpus, default_model.tokenizer))[:2]:
        first = capture(segment.text_a, segment.text_b, model=default_model).probs  # [6, 12, n, n]
        second = capture(segment.text_a, segment.text_b, model=other).probs  # [2, 4, n, n]
        n = first.shape[-1]
        rows_a, rows_b = first.reshape(72, n, n), second.reshape(8, n, n)
        total += np.array([[js_divergence_rows(a, b).sum() for b in rows_b] for a in rows_a])
        tokens += n
    np.testing.assert_allclose(comparison.matching.distance, total / tokens, atol=2e-5)
    assert comparison.query_units == tokens
    assert (comparison.matching.a_of_b >= 0).all() and (comparison.matching.b_of_a >= 0).sum() == 8


def test_different_tokenizers_and_shapes_compare_at_the_word_level(
    default_model: LoadedModel, corpus: Path, tmp_path: Path
) -> None:
    roberta = load_model(save_tiny_model("roberta", tmp_path))  # 3 layers x 4 heads, byte-level BPE
    wide = small_bert(2, 8, default_model.tokenizer, "bert-2x8")
    comparison = compare_models(roberta, wide, corpus, AnalysisSettings(limit=3))
    assert comparison.level == "word"
    assert comparison.shape_a == (3, 4) and comparison.shape_b == (2, 8)
    assert comparison.matching.distance.shape == (12, 16)
    assert sorted(comparison.matching.b_of_a.tolist()) == sorted(set(comparison.matching.b_of_a.tolist()))
    assert (comparison.matching.a_of_b < 0).sum() == 4
    frame = comparison.to_frame()
    assert len(frame) == 16 and frame["layer_a"].isna().sum() == 4
    unmatched = frame[frame["layer_a"].isna()]
    assert unmatched["nearest_b"].isna().all() and unmatched["nearest_a"].notna().all()
    distance = comparison.matching.distance
    for row in unmatched.itertuples():
        b = int(row.layer_b) * 8 + int(row.head_b)
        assert row.nearest_a == "{}-{}".format(*divmod(int(distance[:, b].argmin()), 4))
        assert row.nearest_a_js_divergence == distance[:, b].min()
    assert frame["same_head_js_divergence"].isna().all()
    with pytest.raises(BertologyError, match="same layers and heads"):
        comparison.position_delta("cls")
    with pytest.raises(BertologyError, match="word level"):
        compare_models(roberta, wide, corpus, AnalysisSettings(limit=1), level="token")
    # two different models: the report's first section is headed as such, not as one model's changes
    assert comparison.model_types == ("roberta", "bert") and not comparison.one_design
    title, opening = changed_heading(comparison, 5)
    assert title == "Heads that differ most between the two models"
    assert "different architectures (roberta and bert)" in opening
    same_type = replace(comparison, model_types=("bert", "bert"))  # still of different shapes and tokenizers
    assert changed_heading(same_type, 5)[0] == title
    assert "different layers x heads or tokenizers" in changed_heading(same_type, 5)[1]


def test_word_rows_sum_to_one_and_match_themselves(default_model: LoadedModel, corpus: Path) -> None:
    segment = first_segment(corpus, default_model)
    words = word_attention(capture(segment.text_a, segment.text_b, model=default_model))
    columns = np.arange(len(words.word_positions))[::2]  # half of the words; the rest goes to the last column
    rows = word_rows(words, np.array([0, 3, 5]), columns)
    per_row = rows.reshape(72, 3, len(columns) + 1)
    np.testing.assert_allclose(per_row.sum(-1).numpy(), 1.0, atol=1e-5)
    position = words.word_positions[3]
    np.testing.assert_allclose(
        per_row[5, 1, :-1].numpy(), words.probs[0, 5, position, words.word_positions[columns]]
    )
    itself = compare_models(default_model, default_model, corpus, AnalysisSettings(limit=2), level="word")
    assert itself.level == "word" and itself.matching.is_identity()


def test_a_fine_tuned_run_folder_works_as_model_b(
    default_model: LoadedModel, corpus: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    torch.manual_seed(0)
    classifier = load_model(classifier=True, labels=["0", "1"])
    classifier.model.save_pretrained(run / "model")
    classifier.tokenizer.save_pretrained(run / "model")
    task = tmp_path / "SST-2"
    task.mkdir()
    rows = "".join(f"{sentence}\t{label}\n" for sentence, label in SST2_ROWS)
    for name in ("train.tsv", "dev.tsv"):
        (task / name).write_text("sentence\tlabel\n" + rows, encoding="utf-8")

    output = tmp_path / "out"
    args = ["compare", "default", str(run), "--corpus", str(corpus), "--limit", "3", "--task", str(task)]
    result = CliRunner().invoke(app, [*args, "--max-dev", "4", "--top", "5", "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert "Compared 3 segments at the token level" in result.output

    frame = pd.read_csv(output / "comparison.csv")
    assert len(frame) == 72 and frame["js_divergence"].max() < 1e-6  # same encoder weights
    assert (frame["layer_a"] == frame["layer_b"]).all() and (frame["head_a"] == frame["head_b"]).all()
    assert np.nanmax(np.abs(delta_columns(frame).to_numpy(dtype=float))) == 0.0
    data = json.loads((output / "comparison.json").read_text())
    assert data["summary"]["model B"] == str(run) and data["b_of_a"] == list(range(72))
    cross = pd.read_csv(output / "cross_js_divergence.csv", index_col=0)
    assert cross.shape == (72, 72) and cross.index[13] == "1-1" and cross.columns[13] == "1-1"
    for name in (
        "cross_js_divergence",
        "relative_depth",
        "confidence_a",
        "confidence_b",
        "confidence_delta",
        "ablation_b",
    ):
        assert (output / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    assert not (output / "plots" / "ablation_a.png").exists()  # the default model is no classifier
    report = (output / "report.html").read_text()
    sections = re.findall(r"<h2>(.*?)</h2>", report)
    assert sections[1:] == [
        "Most changed heads",
        "Head matching",
        "Statistics side by side",
        "By relative depth",
        "Confidence",
        "Pattern labels",
        "One input in both models",
        "Single-head ablation",
        "Method",
    ]
    assert "is not a fine-tuned classifier" in report and "<script" not in report
    views = html.unescape((output / "views.html").read_text())
    assert views.count("<iframe") == 2 and "script-src 'sha256-" in views
    assert 'href="views.html"' in report


def test_compare_command_reports_user_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "no.txt")
    result = CliRunner().invoke(
        app, ["compare", "default", "default", "--corpus", missing, "-o", str(tmp_path)]
    )
    assert result.exit_code == 2  # a missing corpus is a usage error, named before any model loads
    shown = "".join(result.output.replace("│", "").split())  # however the error panel wraps the path
    assert "Invalidvaluefor--corpus:" in shown and "no.txt'doesnotexist." in shown, result.output
    result = CliRunner().invoke(
        app, ["compare", "default", "default", "--level", "bytes", "-o", str(tmp_path)]
    )
    assert result.exit_code == 2  # a choice not offered is a usage error, refused before any model loads
    assert "'bytes' is not one of" in result.output


def test_relative_depth_lines_up_models_of_different_depth() -> None:
    np.testing.assert_allclose(relative_depth(2), [0.25, 0.75])
    np.testing.assert_allclose(relative_depth(4)[[0, 3]], [0.125, 0.875])
    np.testing.assert_allclose(relative_depth(6)[2] * 2, relative_depth(12)[4] + relative_depth(12)[5])


@pytest.mark.filterwarnings("ignore::bertology.errors.TruncationWarning")  # the tiny model takes 64 tokens
def test_two_decoders_compare_token_by_token(corpus: Path, tmp_path: Path) -> None:
    """Two causal decoders with one tokenizer (a tiny Llama and a perturbed copy): every head pair's distance
    equals an independent per-row JS divergence of their captured causal attention."""
    first = load_model(save_tiny_model("llama", tmp_path))
    perturbed = copy.deepcopy(first.model)
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in perturbed.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    second = wrap_model(perturbed, first.tokenizer, "llama-perturbed")
    comparison = compare_models(first, second, corpus, AnalysisSettings(limit=2, js_tokens_per_segment=None))
    assert comparison.level == "token"
    heads = first.num_layers * first.num_heads
    total, tokens = np.zeros((heads, heads)), 0
    for segment in list(iter_segments(corpus, first.tokenizer))[:2]:
        rows = []
        for model in (first, second):
            probs = capture(segment.text_a, segment.text_b, model=model).probs  # [layers, heads, n, n]
            assert np.allclose(np.triu(probs, 1), 0.0)  # causal: no weight on later tokens
            rows.append(probs.reshape(heads, *probs.shape[-2:]))
        total += np.array([[js_divergence_rows(a, b).sum() for b in rows[1]] for a in rows[0]])
        tokens += rows[0].shape[-1]
    np.testing.assert_allclose(comparison.matching.distance, total / tokens, atol=2e-5)
    assert comparison.query_units == tokens
    assert np.diag(comparison.matching.distance).min() > 1e-4  # the perturbed copy attends differently
