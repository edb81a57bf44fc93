"""Analyse a corpus: stream its segments through the model and accumulate per-head statistics.

Memory stays flat: each batch's attention is reduced into the accumulators (surface statistics,
pattern scores, Jensen-Shannon head distances) and dropped. Example segments for the report are
found again afterwards by their running index, re-reading the corpus without the model.
"""

from __future__ import annotations

import itertools
import json
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.analysis.distances import DistanceAccumulator, HeadDistances, RowSampler, mds_embedding
from bertology.analysis.patterns import HeadPatterns, PatternAccumulator
from bertology.capture import capture, stream_batch
from bertology.corpus import Segment, iter_segments
from bertology.errors import BertologyError, TruncationWarning
from bertology.inputs import EncodedBatch, Text
from bertology.models import LoadedModel
from bertology.stats.base import HeadTable
from bertology.stats.rows import RowSummarizer, SpecialTokens
from bertology.stats.surface import SurfaceAccumulator

_PATTERN_KEYS = {"layer", "head", "label", "label_segment"}


@dataclass
class CorpusAnalysis:
    """Per-head results over a corpus (heads are 0-based ``(layer, head)``).

    surface: Clark et al.'s surface statistics and Voita's confidence, [layers, heads] each.
    patterns: pattern scores, primary labels and each head's best example segment.
    distances: mean per-token Jensen-Shannon divergence between every two heads (nats).
    segments: segments analysed; truncated_segments / tokens_cut: how many were cut, by how much.
    """

    model_name: str
    corpus: str
    corpus_format: str | None
    max_length: int
    seed: int
    surface: HeadTable
    patterns: HeadPatterns
    distances: HeadDistances
    segments: int
    truncated_segments: int
    tokens_cut: int
    seconds: float

    def heads_frame(self) -> pd.DataFrame:
        """One row per head: layer, head, every surface statistic, the label, its example segment and
        every pattern score (as ``score_<pattern>``)."""
        patterns = self.patterns.to_frame()
        scores = {name: f"score_{name}" for name in patterns.columns if name not in _PATTERN_KEYS}
        return self.surface.to_frame().merge(patterns.rename(columns=scores), on=["layer", "head"])

    def mds(self) -> np.ndarray:
        """[layers * heads, 2] MDS map of the heads from their JS distances (seeded)."""
        return mds_embedding(self.distances.distance, seed=self.seed)

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "corpus": self.corpus,
            "max_length": self.max_length,
            "seed": self.seed,
            "segments": self.segments,
            "truncated_segments": self.truncated_segments,
            "tokens_cut": self.tokens_cut,
            "seconds": round(self.seconds, 2),
        }


def iter_batches(segments: Iterator[Segment], size: int) -> Iterator[list[Segment]]:
    while batch := list(itertools.islice(segments, size)):
        yield batch


def batch_texts(batch: list[Segment]) -> tuple[list[Text], list[Text | None]]:
    """Texts A and B (``None`` for a single text) of a batch of segments."""
    return [segment.text_a for segment in batch], [segment.text_b for segment in batch]


def analyse_batch(
    batch: list[Segment],
    loaded: LoadedModel,
    row_statistics: tuple[SurfaceAccumulator, PatternAccumulator],
    distances: DistanceAccumulator,
    max_length: int,
) -> EncodedBatch:
    """Run one batch of segments and fold it into the accumulators while the model runs.

    As soon as a layer is computed, its rows are summarised (:class:`~bertology.stats.rows.RowSummarizer`)
    and its sampled rows kept for the distances; no layer outlives the next one, and the summary is
    made once for all row statistics. Segments are padded to ``max_length``, so every batch has the same
    shape (steady memory). Returns the encoded batch.
    """
    summarizer: RowSummarizer | None = None
    sampler: RowSampler | None = None

    def consumer(encoded: EncodedBatch) -> Callable[[torch.Tensor], None]:
        nonlocal summarizer, sampler
        summarizer = rows = RowSummarizer(encoded, row_statistics[0].special)
        sampler = sampled = distances.sampler(encoded.lengths)

        def consume(probs: torch.Tensor) -> None:
            rows.add_layer(probs)
            sampled.add_layer(probs)

        return consume

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)  # counted by the caller, reported once
        encoded = stream_batch(
            *batch_texts(batch), consumer, model=loaded, max_length=max_length, pad_to_multiple_of=max_length
        )
    assert summarizer is not None and sampler is not None
    summary = summarizer.result()
    for accumulator in row_statistics:
        accumulator.update_rows(summary)
    distances.add(sampler)
    return encoded


def analyze_corpus(
    corpus: str | Path,
    loaded: LoadedModel,
    *,
    max_length: int = 128,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
    js_tokens_per_segment: int | None = 8,
    corpus_format: str | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> CorpusAnalysis:
    """Stream ``corpus`` through ``loaded`` and return every head's statistics.

    limit: analyse at most this many segments (the first ones). js_tokens_per_segment: query tokens
    sampled per segment for the JS distances (seeded; ``None`` = all). on_progress: called with the
    number of segments done after each batch.

    Raises:
        BertologyError: unreadable or empty corpus, or a corpus too small for the head map.
    """
    start = time.perf_counter()
    special = SpecialTokens.of(loaded)
    surface, patterns = SurfaceAccumulator(special), PatternAccumulator(special)
    distances = DistanceAccumulator(max_tokens_per_segment=js_tokens_per_segment, seed=seed)
    segments = iter_segments(corpus, loaded.tokenizer, max_length=max_length, format=corpus_format)
    done = truncated = cut = 0
    for batch in iter_batches(itertools.islice(segments, limit), batch_size):
        encoded = analyse_batch(batch, loaded, (surface, patterns), distances, max_length)
        done += len(batch)
        truncated += sum(1 for tokens in encoded.truncated if tokens > 0)
        cut += sum(encoded.truncated)
        if on_progress is not None:
            on_progress(done)
    if done == 0:
        raise BertologyError(f"The corpus '{corpus}' gave no segments to analyse.")
    return CorpusAnalysis(
        model_name=loaded.name,
        corpus=str(corpus),
        corpus_format=corpus_format,
        max_length=max_length,
        seed=seed,
        surface=surface.result(),
        patterns=patterns.result(),
        distances=distances.result(),
        segments=done,
        truncated_segments=truncated,
        tokens_cut=cut,
        seconds=time.perf_counter() - start,
    )


def example_segments(analysis: CorpusAnalysis, loaded: LoadedModel, wanted: set[int]) -> dict[int, Segment]:
    """The segments with the given running indices, found again by re-reading the corpus."""
    found: dict[int, Segment] = {}
    if not wanted:
        return found
    segments = iter_segments(
        analysis.corpus, loaded.tokenizer, max_length=analysis.max_length, format=analysis.corpus_format
    )
    for index, segment in enumerate(itertools.islice(segments, max(wanted) + 1)):
        if index in wanted:
            found[index] = segment
    return found


def save_analysis(analysis: CorpusAnalysis, loaded: LoadedModel, outdir: str | Path) -> Path:
    """Write heads.csv, head_distances.csv, summary.json, example head views and report.html.

    Returns the path of ``report.html``.
    """
    from bertology.report.analysis import write_analysis_report
    from bertology.views import head_view

    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    analysis.heads_frame().to_csv(target / "heads.csv", index=False)
    distances = analysis.distances.to_frame()
    distances.index = distances.columns = [f"{layer}-{head}" for layer, head in distances.index]
    distances.rename_axis("layer-head").to_csv(target / "head_distances.csv")
    (target / "summary.json").write_text(json.dumps(analysis.summary(), indent=2), encoding="utf-8")

    chosen = analysis.patterns.label_segment  # [layers, heads], -1 where the head has no label
    wanted = {int(index) for index in np.unique(chosen) if index >= 0}
    segments = example_segments(analysis, loaded, wanted)
    examples: dict[tuple[int, int], str] = {}
    for (layer, head), index in np.ndenumerate(chosen):
        if index < 0 or int(index) not in segments:
            continue
        name = f"examples/segment{index}_layer{layer}.html"
        if not (target / name).exists():
            segment = segments[int(index)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)
                attention = capture(
                    segment.text_a, segment.text_b, model=loaded, max_length=analysis.max_length
                )
            head_view(attention, layer=layer).save(target / name)
        examples[(layer, head)] = name
    return write_analysis_report(
        target,
        surface=analysis.surface,
        patterns=analysis.patterns,
        distances=analysis.distances,
        mds=analysis.mds(),
        examples=examples,
        meta=analysis.summary(),
    )
