"""`bertology analyze`: the streaming pipeline, its files, batching invariance and its errors.

Tolerances: batch sizes 1 and 7 pad differently, so float32 attention differs by a few units of 2^-24
per layer: statistics within rtol 1e-4, atol 1e-5, JS distances 1e-6; streamed accumulators against ones fed
captured batches in other batches, rtol 1e-5, atol 1e-6 (JS sums rtol 1e-5); the JS file written with
all its float64 digits, 1e-9.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.cli import run_command
from support.transfers import HostTransfers

import bertology
import bertology.analysis.analyze
from bertology.analysis.analyze import (
    CorpusAccumulators,
    analyze_corpus,
    batch_texts,
    corpus_batches,
    example_segments,
)
from bertology.analysis.distances import DistanceAccumulator
from bertology.analysis.patterns import PatternAccumulator
from bertology.analysis.settings import AnalysisSettings
from bertology.attention.capturing import capture_batch
from bertology.corpus.segments import Segment, iter_segments, sample_corpus
from bertology.models.loading import LoadedModel
from bertology.report import save_analysis
from bertology.stats import SpecialTokens, SurfaceAccumulator

EXAMPLES = sample_corpus()


@pytest.fixture(scope="module")
def small_corpus(sample_corpus_head: Callable[[int], Path]) -> Path:
    return sample_corpus_head(30)


def test_batch_size_does_not_change_the_results(small_corpus: Path, default_model: LoadedModel) -> None:
    one = analyze_corpus(small_corpus, default_model, AnalysisSettings(limit=10, batch_size=1))
    many = analyze_corpus(small_corpus, default_model, AnalysisSettings(limit=10, batch_size=7))
    assert one.segments == many.segments == 10
    pd.testing.assert_frame_equal(one.heads_frame(), many.heads_frame(), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(one.distances.distance, many.distances.distance, atol=1e-6)


def test_batches_hold_each_window_of_the_corpus_longest_first(
    small_corpus: Path, default_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every window of SORT_WINDOW consecutive segments comes out whole, in order of token count (longest
    first, ties in corpus order), cut into batches; padding is to a multiple of PAD_MULTIPLE; and a
    segment number found again by example_segments is the segment analysed under that number."""
    monkeypatch.setattr(bertology.analysis.analyze, "SORT_WINDOW", 8)
    tokenizer = default_model.tokenizer
    corpus_order = list(iter_segments(small_corpus, tokenizer, max_length=128))
    batches = list(corpus_batches(small_corpus, tokenizer, batch_size=3))
    assert len(corpus_order) == 16 and [len(batch) for batch in batches] == [3, 3, 2] * 2  # two windows
    analysed = [segment for batch in batches for segment in batch]

    def token_counts(segments: list[Segment]) -> list[int]:  # as the encoder counts, independently
        def text(words: str | list[str] | None) -> str | None:
            return words if words is None or isinstance(words, str) else " ".join(words)

        pairs = [(text(segment.text_a), text(segment.text_b)) for segment in segments]
        return [len(tokenizer(a, b, verbose=False)["input_ids"]) for a, b in pairs]

    for start in range(0, 16, 8):
        window, got = corpus_order[start : start + 8], analysed[start : start + 8]
        counts = token_counts(window)
        expected = sorted(range(len(window)), key=lambda index: (-counts[index], index))
        assert got == [window[index] for index in expected]
    assert len(set(token_counts(corpus_order))) > 5  # the order is not trivial

    accumulators = CorpusAccumulators(default_model, corpus=small_corpus)
    widths = [accumulators.update(batch).model_inputs["input_ids"].shape[1] for batch in batches]
    multiple = bertology.analysis.analyze.PAD_MULTIPLE
    assert widths == [-(-max(token_counts(batch)) // multiple) * multiple for batch in batches]

    analysis = accumulators.result()
    wanted = {0, 4, 9, 15}
    assert example_segments(analysis, default_model, wanted) == {index: analysed[index] for index in wanted}


@pytest.mark.parametrize("convention", ["bertology", "clark"])
def test_streamed_analysis_equals_accumulators_fed_captured_batches(
    small_corpus: Path, default_model: LoadedModel, convention: str
) -> None:
    """analyze_corpus summarises each layer while the model runs; the accumulators' own update(batch)
    on fully captured batches is the independent path."""
    settings = AnalysisSettings(limit=9, batch_size=4, js_tokens_per_segment=5, convention=convention)  # type: ignore[arg-type]
    streamed = analyze_corpus(small_corpus, default_model, settings)
    assert streamed.convention == streamed.summary()["convention"] == convention
    special = SpecialTokens.of(default_model)
    surface = SurfaceAccumulator(special, convention=convention)  # type: ignore[arg-type]
    patterns = PatternAccumulator(special)
    distances = DistanceAccumulator(max_tokens_per_segment=5)
    for batch in corpus_batches(small_corpus, default_model.tokenizer, limit=9, batch_size=4):
        captured = capture_batch(*batch_texts(batch), model=default_model, max_length=128)
        for accumulator in (surface, patterns, distances):
            accumulator.update(captured)
    for name, values in surface.result().columns.items():
        np.testing.assert_allclose(streamed.surface[name], values, rtol=1e-5, atol=1e-6, err_msg=name)
    for name, values in patterns.result().scores.columns.items():
        np.testing.assert_allclose(streamed.patterns.scores[name], values, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(streamed.distances.js_sum, distances.result().js_sum, rtol=1e-5)
    assert streamed.distances.tokens == distances.result().tokens


def test_analysis_writes_report_csv_and_examples(
    small_corpus: Path, default_model: LoadedModel, tmp_path: Path
) -> None:
    analysis = analyze_corpus(small_corpus, default_model, AnalysisSettings(limit=12, batch_size=4))
    told: list[tuple[int, int | None, str]] = []
    report = save_analysis(
        analysis,
        default_model,
        tmp_path,
        on_progress=lambda done, total=None, *, stage="": told.append((done, total, stage)),
    )
    # each stage of the writing is shown as it starts and ends (issue 34: nothing showed after the bar)
    stages = [
        "Writing the tables",
        "Storing each head's top examples",
        "Drawing the example views",
        "Drawing the plots and the report",
    ]
    assert told == [(done, 1, stage) for stage in stages for done in (0, 1)]
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert len(heads) == 6 * 12
    assert {"layer", "head", "previous", "next", "entropy", "confidence", "label"} <= set(heads.columns)
    assert not (tmp_path / "head_distances.csv").exists()
    distances = pd.read_csv(tmp_path / "head_js_divergence.csv", index_col=0)
    assert distances.shape == (72, 72) and distances.index[13] == distances.columns[13] == "1-1"
    np.testing.assert_allclose(distances.to_numpy(), analysis.distances.distance, atol=1e-9)
    assert json.loads((tmp_path / "summary.json").read_text())["segments"] == 12
    page = report.read_text(encoding="utf-8")
    links = sorted(set(re.findall(r'href="(examples/[^"]+\.html)"', page)))
    labelled = int((heads["label"] != "none").sum())
    assert labelled == 0 or links, "labelled heads link their example segment"
    for link in links:
        assert (tmp_path / link).is_file()
    assert list((tmp_path / "plots").glob("*.png"))


@pytest.mark.slow
def test_cli_analyze_runs_on_the_example_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_command(["analyze", str(EXAMPLES), "--limit", "6", "-o", str(tmp_path / "out")], capsys)
    assert result.returncode == 0, result.stderr
    assert "Analysed 6 segments" in result.stdout
    assert (tmp_path / "out" / "report.html").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\n\n   \n", "contains no text"),
        (b"A fine first line.\nA second line.\n\xff\xfe broken\n", "line 3"),
    ],
)
def test_cli_analyze_errors_are_one_sentence(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    result = run_command(["analyze", str(corpus), "-o", str(tmp_path / "out")], capsys)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_too_small_a_corpus_for_the_head_map_is_a_clear_error(
    tmp_path: Path, default_model: LoadedModel
) -> None:
    # One tiny model head count is fine; what MDS cannot place is fewer than three heads. With the real
    # model there are always 72 heads, so check the error path through the MDS function directly.
    from bertology.analysis.distances import mds_embedding
    from bertology.errors import BertologyError

    with pytest.raises(BertologyError, match="at least 3 heads"):
        mds_embedding(np.zeros((2, 2)))


def transfers_of_one_batch(loaded: LoadedModel, settings: AnalysisSettings) -> int:
    """Host transfers while the accumulators take the corpus's second batch of 8 (the first warms up)."""
    batches = corpus_batches(sample_corpus(), loaded.tokenizer, max_length=settings.max_length, batch_size=8)
    accumulators = CorpusAccumulators(loaded, settings)
    accumulators.update(next(batches))
    with HostTransfers() as counted:
        accumulators.update(next(batches))
    return counted.count


def test_one_batch_makes_the_same_few_host_transfers_whatever_the_layers_and_blocks(
    default_model: LoadedModel, tiny_model_dirs: dict[str, Path]
) -> None:
    """Not one per layer or per row block: 6 layers or 3, the probabilities or the query/key path, one
    block per layer or many (4 KiB each)."""
    tiny = bertology.load_model(tiny_model_dirs["bert"])
    assert (default_model.num_layers, tiny.num_layers) == (6, 3)
    counts = {
        "6 layers": transfers_of_one_batch(default_model, AnalysisSettings(max_length=64, mode="probs")),
        "3 layers": transfers_of_one_batch(tiny, AnalysisSettings(max_length=64, mode="probs")),
        "queries and keys": transfers_of_one_batch(default_model, AnalysisSettings(max_length=64, mode="qk")),
        "4 KiB blocks": transfers_of_one_batch(
            default_model, AnalysisSettings(max_length=64, mode="qk", chunk_bytes=4096)
        ),
    }
    assert len(set(counts.values())) == 1, counts
    # the statistics stay on the device between batches: what is left are the few reads that size the
    # batch's key-set pairs and the attention mask (5 here; 23 when every accumulator came to the host)
    assert 0 < counts["6 layers"] <= 6
