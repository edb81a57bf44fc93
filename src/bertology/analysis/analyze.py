"""Analyse a corpus: stream its segments through the model and accumulate per-head statistics.

Memory stays flat: each batch's attention is reduced into the accumulators (surface statistics,
pattern scores, Jensen-Shannon head distances) and dropped. Segments are read a window at a time and
batched by length within the window (:func:`corpus_batches`), so batches pad little. Example segments
for the report are found again afterwards by their running index in that order, re-reading the corpus
without the model.
"""

from __future__ import annotations

import copy
import itertools
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from bertology.analysis.distances import (
    DistanceAccumulator,
    HeadDistances,
    RowSampler,
    mds_embedding,
)
from bertology.analysis.patterns import (
    DECODER_LABELS,
    DetectorThresholds,
    HeadPatterns,
    PatternAccumulator,
    decoder_labels,
)
from bertology.analysis.settings import DEFAULT_SETTINGS, AnalysisSettings
from bertology.attention.capturing import (
    AttentionBatch,
    capture_batch,
    encode_for_model,
    stream_batch,
    stream_long_batch,
    uses_queries_keys,
)
from bertology.attention.long_capture import CHUNK_BYTES, LayerQueriesKeys
from bertology.attention.norms import Weights, check_weights
from bertology.corpus.batching import PAD_MULTIPLE, SORT_WINDOW, length_sorted_batches, prefetched
from bertology.corpus.cache import CACHE_OFF, CacheUse, read_segments
from bertology.corpus.encoding import EncodedBatch, Text, stack_rows
from bertology.corpus.reader_processes import default_readers
from bertology.corpus.segments import Segment
from bertology.errors import BertologyError, TruncationWarning
from bertology.models.loading import LoadedModel, require_pair_template, require_single_stack
from bertology.options import BATCH_SIZE, EXAMPLES_PER_HEAD
from bertology.progress import Progress
from bertology.stats.base import HeadTable
from bertology.stats.rows import RowSummarizer, RowSummary, SpecialTokens
from bertology.stats.surface import Convention, SurfaceAccumulator
from bertology.summaries import Summarised

_PATTERN_KEYS = {"layer", "head", "label", "label_segment"}


def head_table_frame(surface: HeadTable, patterns: HeadPatterns) -> pd.DataFrame:
    """One row per head: layer, head, every surface statistic, the label, its example segment and every
    pattern score (as ``score_<pattern>``): the rows of ``heads.csv``."""
    frame = patterns.to_frame()
    scores = {name: f"score_{name}" for name in frame.columns if name not in _PATTERN_KEYS}
    return surface.to_frame().merge(frame.rename(columns=scores), on=["layer", "head"])


@dataclass(repr=False)
class CorpusAnalysis(Summarised):
    """Per-head results over a corpus (heads are 0-based ``(layer, head)``).

    surface: Clark et al.'s surface statistics and Voita's confidence, [layers, heads] each, in the
        ``convention`` given (:mod:`bertology.stats.surface`).
    patterns: pattern scores, primary labels and each head's best example segment.
    distances: mean Jensen-Shannon divergence per query token between every two heads (nats).
    segments: segments analysed; truncated_segments / tokens_cut: how many were cut, by how much.
    weights: the attention weights measured (``"attention"`` or ``"norm"``, see
        :mod:`bertology.attention.norms`). dtype: the precision the model ran in (``"float32"``,
        ``"bfloat16"`` or ``"float16"``; the statistics are float64 sums either way).
    corpus_cache: how the segments came through the encoded-corpus cache (read from an entry, written to
        one, or not: :class:`~bertology.corpus.cache.CacheUse`; the statistics are the same either way).
    detectors: a decoder's previous-token, duplicate-token and induction scores on repeated random tokens
        (:func:`~bertology.analysis.head_detectors.detector_scores`), [layers, heads] each, once
        :meth:`with_detectors` has added them (then the labels are :func:`~bertology.analysis.patterns.
        decoder_labels`'); ``None`` for an encoder.
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
    weights: Weights = "attention"
    convention: Convention = "bertology"
    dtype: str = "float32"
    examples_per_head: int = EXAMPLES_PER_HEAD
    corpus_cache: CacheUse = CACHE_OFF
    detectors: dict[str, np.ndarray] | None = None

    def with_detectors(
        self, scores: dict[str, np.ndarray], thresholds: DetectorThresholds | None = None
    ) -> CorpusAnalysis:
        """The analysis of a decoder with its detector ``scores`` (``[layers, heads]`` per name of
        ``previous_token``, ``duplicate_token``, ``induction``) added and its heads labelled by
        :func:`~bertology.analysis.patterns.decoder_labels` (with the corpus's ``sink`` statistic)."""
        decoder_scores = {**scores, "sink": self.surface["sink"]}
        labels = decoder_labels(self.patterns.labels, decoder_scores, thresholds or DetectorThresholds())
        return replace(self, detectors=dict(scores), patterns=replace(self.patterns, labels=labels))

    def heads_frame(self) -> pd.DataFrame:
        """One row per head: layer, head, every surface statistic (a decoder's ``sink`` among them), the
        label, its example segment (-1 for a decoder label), every pattern score (as ``score_<pattern>``)
        and, for a decoder, its detector scores (``score_previous_token``, ``score_duplicate_token``,
        ``score_induction``)."""
        frame = head_table_frame(self.surface, self.patterns)
        for name in DECODER_LABELS:
            if self.detectors is not None and name in self.detectors:
                frame[f"score_{name}"] = self.detectors[name].reshape(-1)
        return frame

    def mds(self) -> np.ndarray:
        """[layers * heads, 2] MDS map of the heads from their mean JS divergences (seeded)."""
        return mds_embedding(self.distances.distance, seed=self.seed)

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "weights": self.weights,
            "convention": self.convention,
            "dtype": self.dtype,
            "corpus": self.corpus,
            "max_length": self.max_length,
            "seed": self.seed,
            "segments": self.segments,
            "truncated_segments": self.truncated_segments,
            "tokens_cut": self.tokens_cut,
            "examples_per_head": self.examples_per_head,
            "seconds": round(self.seconds, 2),
            "corpus_cache": self.corpus_cache.state,
            **({"corpus_cache_key": self.corpus_cache.key} if self.corpus_cache.key else {}),
        }


def corpus_batches(
    corpus: str | Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    max_length: int = 128,
    limit: int | None = None,
    batch_size: int = BATCH_SIZE,
    corpus_format: str | None = None,
    pairs: bool = True,
    encoded_length: int | None = None,
    cache: bool = True,
    readers: int = 1,
    on_cache: Callable[[CacheUse], None] | None = None,
    model: str = "",
) -> Iterator[list[Segment]]:
    """The first ``limit`` segments of ``corpus`` (all if ``None``), packed with ``tokenizer`` into at most
    ``max_length`` tokens each (:func:`~bertology.corpus.segments.iter_segments`; ``pairs=False`` for a
    decoder: single texts), in batches of ``batch_size``.

    Every :data:`SORT_WINDOW` consecutive segments are ordered by token count (:attr:`Segment.tokens`),
    longest first (a stable sort), before they are cut into batches, so the segments of a batch are about
    as long and the batch, padded to its longest, pads little: on Clark-style segments of at most 128
    tokens (88 on average) batches pad 5% instead of 45%, and the forward pass and the analysis both do
    about a third less work (benchmarks/RESULTS.md). Longest first, each window's first batch takes the
    most memory and the later ones fit in what it freed. The order does not depend on ``batch_size``;
    segment numbers (e.g. a pattern's best segment) count in it.

    The segments come through the encoded-corpus cache (:func:`~bertology.corpus.cache.read_segments`;
    ``cache=False``, or a ``limit``: read from the file, nothing written: a limited run reads only the
    corpus's beginning, and the cache's key would hash the whole file); ``encoded_length``: each also
    carries its encoding cut to this many tokens (:attr:`~bertology.corpus.segments.Segment.encoded`), which
    :meth:`CorpusAccumulators.encode` then stacks instead of encoding again. ``readers``: processes that
    read, segment and encode the corpus when the cache does not serve it
    (:mod:`bertology.corpus.reader_processes`; 1: the calling thread); the segments are the same for any
    number. on_cache, model: as :func:`~bertology.corpus.cache.read_segments` takes them (how the pass
    uses the cache; the model named in an entry it writes).
    """
    segments = read_segments(
        corpus,
        tokenizer,
        max_length=max_length,
        format=corpus_format,
        pairs=pairs,
        encoded_length=encoded_length,
        cache=cache and limit is None,
        readers=readers,
        on_cache=on_cache,
        model=model,
    )
    limited = itertools.islice(segments, limit)
    return length_sorted_batches(limited, _segment_tokens, batch_size=batch_size, window=SORT_WINDOW)


def _segment_tokens(segment: Segment) -> int:
    return segment.tokens


def batch_texts(batch: list[Segment]) -> tuple[list[Text], list[Text | None]]:
    """Texts A and B (``None`` for a single text) of a batch of segments."""
    return [segment.text_a for segment in batch], [segment.text_b for segment in batch]


#: On the query/key path (:func:`~bertology.attention.capturing.uses_queries_keys`), batches hold at
#: most this many tokens (``--batch-size`` is lowered to fit): the forward pass's boolean masks grow as
#: batch x N².
LONG_BATCH_TOKENS = 16_384


class _LayerConsumer:
    """Receives one batch's layers as the model computes them: each layer's rows are summarised
    (:class:`~bertology.stats.rows.RowSummarizer`) and its sampled rows kept for the distances.

    chunk_bytes: for long inputs (queries and keys, :meth:`add_queries_keys`), the memory bound of one
    block of rows; ``None`` for probabilities (:meth:`add_layer`).
    """

    def __init__(
        self,
        special: SpecialTokens,
        distances: DistanceAccumulator,
        scratch: torch.Tensor | None,
        smoothing: float,
        chunk_bytes: int | None = None,
    ) -> None:
        self.special, self.distances, self.scratch, self.smoothing = special, distances, scratch, smoothing
        self.chunk_bytes = chunk_bytes

    def __call__(
        self, encoded: EncodedBatch
    ) -> Callable[[torch.Tensor], None] | Callable[[LayerQueriesKeys], None]:
        self.summarizer = RowSummarizer(encoded, self.special, self.scratch, smoothing=self.smoothing)
        self.sampler = self.distances.sampler(encoded.lengths)
        return self.add_layer if self.chunk_bytes is None else self.add_queries_keys

    def add_queries_keys(self, layer: LayerQueriesKeys) -> None:
        """One layer of the batch as queries and keys: its rows summarised block by block (each at most
        :attr:`chunk_bytes`), and only its sampled rows computed for the distances."""
        chunk_bytes = self.chunk_bytes or CHUNK_BYTES
        for start, block in layer.row_blocks(chunk_bytes):
            self.summarizer.add_rows(block, start)
        sampler = self.sampler
        sampler.add_rows(layer.rows_at(sampler.segment_of, sampler.position, chunk_bytes))

    def add_layer(self, probs: torch.Tensor) -> None:
        """``probs`` [batch, heads, N, N]: one layer of the batch."""
        self.summarizer.add_layer(probs)
        self.sampler.add_layer(probs)


class CorpusAccumulators:
    """One model's streaming accumulators over a corpus: surface statistics, pattern scores and the mean
    JS divergence between heads, fed a batch of segments at a time (:meth:`update`) and read with
    :meth:`result` (an :class:`~bertology.accumulator.Accumulator`).

    settings: what is measured and how (:class:`~bertology.analysis.settings.AnalysisSettings`: seed, sample
    size, weights, convention, capture mode and its block size, examples kept per head; its ``max_length``
    is the longest segment :meth:`update` is given). corpus: the file the segments come from (named by the
    result and its errors); the result's seconds count from the accumulators' creation. On the query/key
    path (:func:`~bertology.attention.capturing.uses_queries_keys`) rows are computed block by block,
    peak memory
    linear in the tokens beyond one block; both paths give the same statistics. first_segment: the number of
    the first segment added (segments count from there in the order they are added), so the accumulators of
    consecutive shards of a corpus, each given its shard's first number, merged (:meth:`merge`) equal one
    pass over the whole (:mod:`bertology.cluster`). Nothing here changes process-wide settings; a program
    that runs many batches may first call :func:`bertology.allocator.keep_freed_memory`, as ``bertology
    analyze`` does.

    Raises:
        BertologyError: a model that is not an encoder, unknown weights or an unknown convention.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        settings: AnalysisSettings = DEFAULT_SETTINGS,
        *,
        corpus: str | Path = "",
        first_segment: int = 0,
    ) -> None:
        require_single_stack(loaded, "Corpus analysis")
        check_weights(settings.weights)
        self.loaded, self.settings, self.corpus = loaded, settings, str(corpus)
        self.started = time.perf_counter()
        self.special = SpecialTokens.of(loaded)
        self.surface = SurfaceAccumulator(self.special, convention=settings.convention)
        self.patterns = PatternAccumulator(
            self.special, first_segment=first_segment, keep=max(1, settings.examples_per_head)
        )
        self.distances = DistanceAccumulator(
            max_tokens_per_segment=settings.js_tokens_per_segment,
            seed=settings.seed,
            first_segment=first_segment,
        )
        self.segments = self.truncated_segments = self.tokens_cut = 0
        #: The rows the distances sampled from the last batch (its :class:`RowSampler`), or ``None``.
        self.last_sample: RowSampler | None = None
        #: The row summary's scratch buffer, kept from batch to batch (see :class:`RowSummarizer`).
        self.scratch: torch.Tensor | None = None

    @property
    def items(self) -> int:
        """Segments added (or merged) so far."""
        return self.segments

    def update(self, batch: list[Segment] | EncodedBatch) -> EncodedBatch:
        """Run one batch of segments (each cut to the settings' ``max_length``), or a batch already encoded
        (:meth:`encode`, e.g. by a reader thread), and fold it into the accumulators while the model runs.

        No layer outlives the next one, and the row summary is made once for all row statistics.
        The batch is padded to a multiple of :data:`PAD_MULTIPLE` tokens. Returns the encoded batch.
        """
        encoded = batch if isinstance(batch, EncodedBatch) else self.encode(batch)
        long = self.uses_queries_keys()
        chunk_bytes = self.settings.chunk_bytes if long else None
        smoothing = self.surface.smoothing
        consumer = _LayerConsumer(self.special, self.distances, self.scratch, smoothing, chunk_bytes)
        if long:
            stream_long_batch(encoded, consumer, model=self.loaded)
        else:
            stream_batch(encoded, consumer, model=self.loaded, weights=self.settings.weights)
        self.distances.add(consumer.sampler)
        self.last_sample = consumer.sampler
        self.scratch = consumer.summarizer.scratch
        self._fold(consumer.summarizer.result(), encoded)
        return encoded

    def encode(self, batch: list[Segment], tokenizer: PreTrainedTokenizerBase | None = None) -> EncodedBatch:
        """``batch`` encoded as :meth:`update` runs it (cut to the settings' ``max_length``, padded to a
        multiple of :data:`PAD_MULTIPLE`, no truncation warnings: the cuts are counted and reported once by
        the caller); ``tokenizer``: a copy of the model's, for a thread that encodes while the model runs.
        Segments that carry their encoding at this length (:attr:`~bertology.corpus.segments.Segment.encoded`,
        from the reader or the cache) are stacked, not encoded again: the same batch."""
        limit = min(self.settings.max_length, self.loaded.max_length)
        rows = [segment.encoded for segment in batch if segment.encoded_length == limit]
        if len(rows) == len(batch):
            if any(segment.is_pair for segment in batch):
                require_pair_template(self.loaded)
            return stack_rows(rows, tokenizer or self.loaded.tokenizer, pad_to_multiple_of=PAD_MULTIPLE)
        return encode_for_model(
            self.loaded,
            *batch_texts(batch),
            max_length=self.settings.max_length,
            pad_to_multiple_of=PAD_MULTIPLE,
            tokenizer=tokenizer,
            warn=False,
        )

    def uses_queries_keys(self) -> bool:
        """Whether :meth:`update` computes segments of up to the settings' ``max_length`` tokens from queries
        and keys."""
        mode, max_length = self.settings.mode, self.settings.max_length
        if mode != "auto":
            return mode == "qk"
        return uses_queries_keys(self.loaded, min(max_length, self.loaded.max_length), self.settings.weights)

    def add_captured(self, batch: list[Segment]) -> AttentionBatch:
        """As :meth:`update`, but capture the batch's whole attention ``[B, L, H, N, N]`` and return it, for a
        caller that needs more of it than the statistics (e.g. word-level attention); one forward pass
        either way, more memory here. :attr:`last_sample` is not kept."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncationWarning)
            captured = capture_batch(
                *batch_texts(batch),
                model=self.loaded,
                max_length=self.settings.max_length,
                pad_to_multiple_of=PAD_MULTIPLE,
                weights=self.settings.weights,
            )
        self.distances.update(captured)
        self.last_sample = None
        self._fold(RowSummary.of(captured, self.special, smoothing=self.surface.smoothing), captured.encoded)
        return captured

    def merge(self, other: CorpusAccumulators) -> Self:
        """Fold in ``other``'s sums (another shard of the corpus, analysed with the same model and
        settings, e.g. on a worker) and return ``self``; ``other`` is left as it was.

        Raises:
            BertologyError: ``other`` was measured with other settings.
        """
        if other.settings != self.settings:
            raise BertologyError(
                f"Cannot merge corpus statistics of settings {other.settings} into {self.settings}."
            )
        self.surface.merge(other.surface)
        self.patterns.merge(other.patterns)
        self.distances.merge(other.distances)
        self.segments += other.segments
        self.truncated_segments += other.truncated_segments
        self.tokens_cut += other.tokens_cut
        return self

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the model and the per-batch buffers: a worker sends its sums, not its model. An
        unpickled copy is for :meth:`merge` into accumulators that hold the model."""
        return {**self.__dict__, "loaded": None, "last_sample": None, "scratch": None}

    def _fold(self, summary: RowSummary, encoded: EncodedBatch) -> None:
        """Fold one batch's row summary into the row statistics and count its segments and cuts."""
        self.surface.update_rows(summary)
        self.patterns.update_rows(summary)
        self.segments += len(encoded)
        self.truncated_segments += sum(1 for tokens in encoded.truncated if tokens > 0)
        self.tokens_cut += sum(encoded.truncated)

    def result(self) -> CorpusAnalysis:
        """The :class:`CorpusAnalysis` of everything added so far.

        Raises:
            BertologyError: no segment was added.
        """
        if self.segments == 0:
            raise BertologyError(f"The corpus '{self.corpus}' gave no segments to analyse.")
        return CorpusAnalysis(
            model_name=self.loaded.name,
            corpus=self.corpus,
            corpus_format=self.settings.corpus_format,
            max_length=self.settings.max_length,
            seed=self.settings.seed,
            surface=self.surface.result(),
            patterns=self.patterns.result(),
            distances=self.distances.result(),
            segments=self.segments,
            truncated_segments=self.truncated_segments,
            tokens_cut=self.tokens_cut,
            seconds=time.perf_counter() - self.started,
            weights=self.settings.weights,
            convention=self.surface.convention,
            dtype=str(self.loaded.dtype).removeprefix("torch."),
            examples_per_head=self.settings.examples_per_head,
        )


def analyze_corpus(
    corpus: str | Path,
    loaded: LoadedModel,
    settings: AnalysisSettings = DEFAULT_SETTINGS,
    *,
    readers: int | None = None,
    on_progress: Progress | None = None,
) -> CorpusAnalysis:
    """Stream ``corpus`` through ``loaded`` and return every head's statistics.

    settings: how the corpus is read and measured (:class:`~bertology.analysis.settings.AnalysisSettings`;
    segments over :data:`~bertology.attention.long_capture.LONG_INPUT_TOKENS` tokens, up to the model's
    own limit, are computed from queries and keys, in batches of at most :data:`LONG_BATCH_TOKENS` tokens).
    readers: processes that read, segment and encode the corpus (:func:`corpus_batches`; ``None``:
    :func:`~bertology.corpus.reader_processes.default_readers` for the model's device); the results are
    the same for any number.
    on_progress: told the segments done after each batch, and the limit as the total
    (:class:`~bertology.progress.Progress`).

    Raises:
        BertologyError: unreadable or empty corpus, or a corpus too small for the head map.
    """
    accumulators = CorpusAccumulators(loaded, settings, corpus=corpus)
    uses: list[CacheUse] = []  # how the pass uses the cache, told as it starts
    batch_size = settings.batch_size
    if accumulators.uses_queries_keys():
        batch_size = min(batch_size, max(1, LONG_BATCH_TOKENS // min(settings.max_length, loaded.max_length)))
    batches = corpus_batches(
        corpus,
        loaded.tokenizer,
        max_length=settings.max_length,
        limit=settings.limit,
        batch_size=batch_size,
        corpus_format=settings.corpus_format,
        pairs=loaded.kind == "encoder",
        encoded_length=min(settings.max_length, loaded.max_length),
        cache=settings.cache,
        readers=readers or default_readers(str(loaded.device)),
        on_cache=uses.append,
        model=loaded.name,
    )
    reader = copy.deepcopy(loaded.tokenizer)  # the reader thread's own: a tokenizer serves one thread
    encoded = (accumulators.encode(batch, reader) for batch in batches)
    for batch in prefetched(encoded):  # the corpus is read, segmented and encoded while the model runs
        accumulators.update(batch)
        if on_progress is not None:
            on_progress(accumulators.segments, settings.limit)
    return replace(accumulators.result(), corpus_cache=uses[0])


def example_segments(analysis: CorpusAnalysis, loaded: LoadedModel, wanted: set[int]) -> dict[int, Segment]:
    """The segments with the given running indices (in the order of :func:`corpus_batches`), found again
    by re-reading the corpus."""
    found: dict[int, Segment] = {}
    if not wanted:
        return found
    batches = corpus_batches(  # the same windows as the analysis: its segments, no more
        analysis.corpus,
        loaded.tokenizer,
        max_length=analysis.max_length,
        limit=analysis.segments,
        corpus_format=analysis.corpus_format,
        pairs=loaded.kind == "encoder",
    )
    order = itertools.chain.from_iterable(batches)
    for index, segment in enumerate(itertools.islice(order, max(wanted) + 1)):
        if index in wanted:
            found[index] = segment
    return found
