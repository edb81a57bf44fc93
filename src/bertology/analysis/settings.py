"""The settings of a corpus run, in one picklable object: how ``analyze`` and ``compare`` read a corpus and
measure its heads.

:func:`~bertology.analysis.analyze.analyze_corpus`, :func:`~bertology.analysis.comparison.compare_models`,
their accumulators and their cluster jobs (:mod:`bertology.cluster`) all take an :class:`AnalysisSettings`, as
fine-tuning takes a :class:`~bertology.training.settings.FinetuneSettings`; a Ray job carries it to the
workers and a checkpoint's run identity includes it, so no option can be dropped on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertology.attention.capturing import CaptureMode
from bertology.attention.long_capture import CHUNK_BYTES
from bertology.options import (
    BATCH_SIZE,
    EXAMPLES_PER_HEAD,
    JS_TOKENS_PER_SEGMENT,
    Convention,
    CorpusFormat,
    Weights,
)


@dataclass(frozen=True)
class AnalysisSettings:
    """How a corpus run reads its corpus and measures its heads (every field has the command line's default).

    Reading: max_length: tokens per segment, special tokens included (longer paragraphs are cut into
    several segments, longer text pairs truncated); limit: at most this many segments, the first ones
    (``None``: all); batch_size: segments per forward pass; corpus_format: ``"text"``, ``"jsonl"`` or
    ``"conllu"`` (``None``: from the file name; :mod:`bertology.corpus.segments`).

    Measuring: seed: of the sampled query tokens and the head map; js_tokens_per_segment: query tokens
    sampled per segment for the heads' Jensen-Shannon divergences (``None``: all); weights: the softmax
    output (``"attention"``) or the norm-based weights (``"norm"``, :mod:`bertology.attention.norms`);
    convention: of the surface statistics (:mod:`bertology.stats.surface`); mode: ``"auto"`` computes segments
    over :data:`~bertology.attention.long_capture.LONG_INPUT_TOKENS` tokens from queries and keys, ``"qk"``
    always, ``"probs"`` never (the statistics are the same); chunk_bytes: the memory bound of one block of
    rows on the query/key path (bytes); examples_per_head: the best segments kept per pattern and head for the
    stored examples (:mod:`bertology.analysis.examples`; 0: none stored).
    """

    max_length: int = 128
    limit: int | None = None
    batch_size: int = BATCH_SIZE
    corpus_format: CorpusFormat | None = None
    seed: int = 0
    js_tokens_per_segment: int | None = JS_TOKENS_PER_SEGMENT
    weights: Weights = "attention"
    convention: Convention = "bertology"
    mode: CaptureMode = "auto"
    chunk_bytes: int = CHUNK_BYTES
    examples_per_head: int = EXAMPLES_PER_HEAD
    cache: bool = True


#: Every setting at its default.
DEFAULT_SETTINGS = AnalysisSettings()
