"""Head detectors: constructed heads of each kind, the repeated random tokens, labels, and `bertology heads`
on a tiny decoder.

Tolerances: detector scores of constructed float64 attention, 1e-12; written CSV columns against scores
recomputed here from the model's float32 attention in other batches, atol 1e-5.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from bertology.analysis.analyze import analyze_corpus
from bertology.analysis.head_detectors import (
    DETECTORS,
    HEAD_SCORES,
    REPEATED_LENGTH,
    SEQUENCES,
    HeadDetection,
    detect_heads,
    detection_patterns,
    pattern_scores,
    repeated_random_tokens,
    sink_scores,
)
from bertology.analysis.patterns import DetectorThresholds, decoder_labels
from bertology.analysis.settings import AnalysisSettings
from bertology.cli import app
from bertology.corpus.segments import sample_corpus
from bertology.errors import BertologyError
from bertology.files.run_files import DETECTORS_FILE, HEADS_FILE
from bertology.models.loading import LoadedModel
from bertology.report.analysis import save_analysis
from bertology.server.runs import RunsFolder

L = 12  # random tokens per half
N = 2 * L + 1  # with the first token
SECOND_HALF = range(L + 1, N)  # rows whose token occurred before, at row - L


def _head(targets: Callable[[int], int]) -> np.ndarray:
    """[N, N]: each query row puts all its attention on the key ``targets(row)`` (a causal head)."""
    attention = np.zeros((N, N))
    for row in range(N):
        attention[row, targets(row)] = 1.0
    return attention


#: Pure heads of each kind on [f, r_1..r_L, r_1..r_L]; where a kind has no key for a row, itself.
HEADS = {
    "previous_token": _head(lambda row: max(row - 1, 0)),
    "duplicate_token": _head(lambda row: row - L if row in SECOND_HALF else row),
    "induction": _head(lambda row: row - L + 1 if row in SECOND_HALF else row),
    "sink": _head(lambda row: 0),
}


def _scores(ids: torch.Tensor, probs: torch.Tensor) -> dict[str, np.ndarray]:
    """Every score of ``probs [1, heads, N, N]`` on the sequence ``ids [1, N]``: {name: [heads]}."""
    patterns = detection_patterns(ids)
    scores = {name: pattern_scores(probs, patterns[name])[0].numpy() for name in DETECTORS}
    scores["sink"] = sink_scores(probs, torch.tensor([N]))[0].numpy()
    return scores


def test_each_pure_head_scores_1_for_its_kind_and_about_0_for_the_others() -> None:
    random = np.arange(100, 100 + L)
    ids = torch.tensor(np.concatenate([[7], random, random]))[None]
    probs = torch.tensor(np.stack(list(HEADS.values())))[None]  # [1, 4 heads, N, N]
    scores = _scores(ids, probs)
    one_row = 1 / (N - 1)  # row 1's previous token is the first token: one of the N - 1 rows after it
    expected = {  # rows: the heads in HEADS order; columns: the scores in HEAD_SCORES order
        "previous_token": [1.0, 0.0, 0.0, one_row],
        "duplicate_token": [0.0, 1.0, 0.0, 0.0],
        "induction": [0.0, 0.0, 1.0, 0.0],
        "sink": [one_row, 0.0, 0.0, 1.0],
    }
    for column, name in enumerate(HEAD_SCORES):
        assert scores[name] == pytest.approx([expected[head][column] for head in HEADS], abs=1e-12), name
    assert one_row < 0.05


def test_a_score_averages_only_the_rows_that_have_a_key_of_the_pattern() -> None:
    """A head attending half to the induction key and half to the first token scores 0.5 for induction
    (TransformerLens's measure, over all N rows, would give 0.5 * L / N)."""
    random = np.arange(100, 100 + L)
    ids = torch.tensor(np.concatenate([[7], random, random]))[None]
    half = 0.5 * HEADS["induction"] + 0.5 * HEADS["sink"]
    half[: L + 1] = HEADS["induction"][: L + 1]  # rows without an induction key: themselves
    scores = _scores(ids, torch.tensor(half)[None, None])
    assert scores["induction"] == pytest.approx([0.5])
    assert scores["sink"] == pytest.approx([0.5 * L / (N - 1)])


def test_repeated_random_tokens_are_seeded_distinct_and_repeated(default_model: LoadedModel) -> None:
    tokenizer = default_model.tokenizer
    ids = repeated_random_tokens(tokenizer, length=30, sequences=4, seed=3)
    assert ids.shape == (4, 61)
    assert (ids[:, 0] == tokenizer.cls_token_id).all()  # MiniLM has no BOS: its [CLS] comes first
    assert (ids[:, 1:31] == ids[:, 31:]).all()
    for row in ids:
        assert len(set(row[1:31].tolist())) == 30
        assert not set(row[1:].tolist()) & set(tokenizer.all_special_ids)
    assert (repeated_random_tokens(tokenizer, length=30, sequences=2, seed=3) == ids[:2]).all()
    assert not (repeated_random_tokens(tokenizer, length=30, sequences=4, seed=4) == ids).all()
    with pytest.raises(BertologyError, match="only"):
        repeated_random_tokens(tokenizer, length=len(tokenizer), sequences=1, seed=0)


def test_labels_and_strongest_heads_follow_the_thresholds() -> None:
    grid = {
        "previous_token": np.array([[0.9, 0.1], [0.2, 0.5]]),
        "duplicate_token": np.array([[0.0, 0.1], [0.39, 0.0]]),
        "induction": np.array([[0.0, 0.7], [0.0, np.nan]]),
        "sink": np.array([[0.6, 0.2], [0.0, 0.0]]),
    }
    detection = HeadDetection("m", grid, length=5, sequences=2, seed=0, corpus="c", segments=3)
    assert detection.labels.tolist() == [["previous_token+sink", "induction"], ["none", "previous_token"]]
    assert detection.top("previous_token", 3) == [(0, 0, 0.9), (1, 1, 0.5), (1, 0, 0.2)]
    assert detection.top("induction", 2) == [(0, 1, 0.7), (0, 0, 0.0)]  # NaN last
    strict = HeadDetection(
        "m",
        grid,
        length=5,
        sequences=2,
        seed=0,
        corpus="c",
        segments=3,
        thresholds=DetectorThresholds(sink=0.7),
    )
    assert strict.labels[0, 0] == "previous_token"
    frame = detection.to_frame()
    assert list(frame.columns) == ["layer", "head", *HEAD_SCORES, "labels"]
    assert json.loads(detection.to_json())["scores"]["induction"] == [[0.0, 0.7], [0.0, None]]


def test_detect_heads_refuses_an_encoder_decoder(loaded_types: Callable[[str], LoadedModel]) -> None:
    with pytest.raises(BertologyError, match="Head detection works on encoder and decoder models"):
        detect_heads(loaded_types("bart"), sample_corpus(), length=3, sequences=1, segments=1)


#: `bertology heads` options of a run of seconds.
SMALL_RUN = ["--length", "6", "--sequences", "3", "--segments", "4", "--max-len", "32", "--device", "cpu"]


def test_bertology_heads_writes_scores_plots_views_and_report(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    output = tmp_path / "heads"
    result = CliRunner().invoke(
        app,
        ["heads", str(tiny_model_dirs["gpt2"]), "-o", str(output), *SMALL_RUN],
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(output / "head_scores.csv")
    layers, heads = frame["layer"].max() + 1, frame["head"].max() + 1
    assert len(frame) == layers * heads
    assert frame[list(HEAD_SCORES)].apply(lambda column: column.between(0, 1)).all().all()
    summary = json.loads((output / "head_scores.json").read_text())
    assert summary["repeated_tokens"] == {"length": 6, "sequences": 3, "seed": 0}
    assert summary["sink_corpus"]["segments"] == 4
    for name in HEAD_SCORES:
        assert (output / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        top = summary["top_heads"][name][0]
        best = frame.loc[frame[name].idxmax()]
        assert (top["layer"], top["head"]) == (best["layer"], best["head"])
        assert (output / "views" / f"{name}_L{top['layer']}_H{top['head']}.html").is_file()
    report = (output / "report.html").read_text()
    assert f"views/induction_L{summary['top_heads']['induction'][0]['layer']}_H" in report
    first = summary["top_heads"]["previous_token"][0]
    assert f"Strongest heads (0-based): previous_token {first['layer']}-{first['head']} " in result.stdout
    # the folder is marked as a `heads` run of its model, and the web app lists it so
    listed = RunsFolder(tmp_path).runs()
    assert [(run.path, run.kind, run.model) for run in listed] == [("heads", "heads", summary["model"])]


def _pattern_mass(
    probs: np.ndarray, ids: np.ndarray, keys: Callable[[np.ndarray, int, int], bool]
) -> np.ndarray:
    """[layers, heads] mean over sequences of the mean over the query rows with a pattern key of the mass
    on those keys, by loops: ``probs`` [sequences, layers, heads, n, n], ``keys(tokens, query, key)``."""
    sequences, layers, heads, n, _ = probs.shape
    total = np.zeros((layers, heads))
    for s in range(sequences):
        rows = [(i, [j for j in range(i + 1) if keys(ids[s], i, j)]) for i in range(n)]
        rows = [(i, wanted) for i, wanted in rows if wanted]
        total += np.mean([probs[s][:, :, i][:, :, wanted].sum(-1) for i, wanted in rows], axis=0)
    return total / sequences


def test_a_decoder_analysis_reports_its_detectors(
    loaded_types: Callable[[str], LoadedModel], sample_corpus_head: Callable[[int], Path], tmp_path: Path
) -> None:
    """`analyze`'s report of a decoder draws its detector scores beside the sink, and head_detectors.csv
    holds them: equal to the model's own eager attention on the same repeated sequences, scored here."""
    loaded = loaded_types("llama")
    analysis = analyze_corpus(sample_corpus_head(8), loaded, AnalysisSettings(max_length=32))
    report = save_analysis(analysis, loaded, tmp_path)
    assert 'id="decoder-heads"' in report.read_text(encoding="utf-8")
    written = pd.read_csv(tmp_path / DETECTORS_FILE)
    length = min(REPEATED_LENGTH, (loaded.max_length - 1) // 2)
    ids = repeated_random_tokens(loaded.tokenizer, length=length, sequences=SEQUENCES, seed=0)
    with torch.inference_mode():
        attentions = loaded.model(input_ids=torch.from_numpy(ids), output_attentions=True).attentions
    probs = torch.stack(attentions, dim=1).double().numpy()  # [sequences, layers, heads, n, n]
    expected = {
        "previous_token": _pattern_mass(probs, ids, lambda tokens, i, j: j == i - 1),
        "duplicate_token": _pattern_mass(probs, ids, lambda tokens, i, j: j < i and tokens[j] == tokens[i]),
        "induction": _pattern_mass(
            probs, ids, lambda tokens, i, j: 1 <= j <= i and tokens[j - 1] == tokens[i]
        ),
    }
    for name, grid in expected.items():
        np.testing.assert_allclose(written[name].to_numpy(), grid.ravel(), atol=1e-5, err_msg=name)
    assert (written[["layer", "head"]].to_numpy() == np.indices(grid.shape).reshape(2, -1).T).all()
    # heads.csv holds the same scores beside the sink, and its labels follow the decoder's rules on them
    heads = pd.read_csv(tmp_path / HEADS_FILE, keep_default_na=False, na_values=[""])
    for name, grid in expected.items():
        np.testing.assert_allclose(heads[f"score_{name}"].to_numpy(), grid.ravel(), atol=1e-5, err_msg=name)
    scores = {name: heads[f"score_{name}"].to_numpy() for name in expected} | {
        "sink": heads["sink"].to_numpy()
    }
    corpus_labels = analysis.patterns.labels.ravel()  # the analysis before the detectors: the corpus's labels
    relabelled = decoder_labels(corpus_labels, scores, DetectorThresholds())
    assert heads["label"].tolist() == relabelled.tolist()
    text = report.read_text(encoding="utf-8")
    assert "<td>induction</td>" in text and "<td>sink</td>" in text  # the label definitions list them


def test_decoder_labels_follow_their_precedence() -> None:
    """One head per rule of decoder_labels, each reaching that rule and every later one (so precedence, not
    the score's size, decides), and a NaN score that never qualifies."""
    corpus = np.array([["next", "next", "next", "next", "broad", "none", "broad"]], dtype=object)
    scores = {
        "induction": np.array([[0.4, 0.0, 0.0, 0.0, 0.0, 0.0, np.nan]]),
        "duplicate_token": np.array([[0.9, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0]]),
        "previous_token": np.array([[0.9, 0.9, 0.5, 0.0, 0.0, 0.0, 0.0]]),
        "sink": np.array([[0.9, 0.9, 0.9, 0.99, 0.5, 0.49, 0.0]]),
    }
    labels = decoder_labels(corpus, scores, DetectorThresholds())
    expected = ["induction", "duplicate_token", "previous_token", "next", "sink", "none", "broad"]
    assert labels.tolist() == [expected]
    assert decoder_labels(corpus, scores, DetectorThresholds(induction=0.5))[0, 0] == "duplicate_token"
