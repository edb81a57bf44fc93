"""Each head's top examples over a corpus, stored compactly so that an explorer never re-runs the corpus.

For every head, the ``k`` segments where the score of its *example pattern* was highest: its label
(:func:`~bertology.analysis.patterns.label_heads`), or for a head labelled ``"none"`` the pattern whose
score came closest to its threshold (the largest ``score / threshold``). The segments are chosen while
the corpus streams (a bounded top-k per pattern and head,
:class:`~bertology.analysis.patterns.PatternAccumulator`); afterwards only those segments (at most
``layers x heads x k``, usually far fewer, since heads share segments) are captured again, in batches,
and each head keeps its own ``[n, n]`` attention on each of its examples as 8-bit codes
``round(p * 255)`` (absolute error at most 1/510, as the views carry it).

The file (:data:`EXAMPLES_FILE`, NumPy ``.npz``, deflated, read without pickle) holds ``segments`` and
``scores`` ``[layers, heads, k]`` (segment numbers in the analysis's batching order, -1 past the
segments that defined the pattern; their scores, ``-inf`` there), ``offsets`` ``[layers, heads, k]``
(where each example's ``n * n`` codes start in ``attention``, -1 for none), ``attention`` (uint8, every
example's codes end to end) and ``meta``: JSON text with the model, weights, each head's example pattern
and, per segment, its tokens, text A / B segment ids, special-token flags, word ids, words, their
segments and origin.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from bertology.analysis.patterns import PATTERNS, HeadPatterns
from bertology.attention.capturing import capture_batch
from bertology.corpus.encoding import TokenRoles
from bertology.errors import BertologyError

if TYPE_CHECKING:
    from bertology.attention.norms import Weights
    from bertology.corpus.segments import Segment
    from bertology.models.loading import LoadedModel

#: The examples file of an analysis folder.
EXAMPLES_FILE = "head_examples.npz"

#: Examples are stored for segments of at most this many tokens (one head's ``n x n`` codes each).
EXAMPLE_MAX_TOKENS = 512

#: Segments captured together when the examples are collected: at most this many attention values
#: ``segments x layers x heads x n x n`` per batch (float32: 256 MiB).
BATCH_VALUES = 64 * 1024 * 1024

#: The 8-bit code of probability 1.
SCALE = 255


def example_patterns(patterns: HeadPatterns) -> np.ndarray:
    """``[layers, heads]`` object array: the pattern each head's examples are ranked by: its label, or for
    ``"none"`` and a decoder's labels that are no corpus pattern (``induction``, ``sink``, ...) the pattern
    with the largest ``score / threshold`` (NaN scores never chosen)."""
    limits = np.array([getattr(patterns.thresholds, name) for name in PATTERNS])[:, None, None]
    ratios = np.stack([patterns.scores[name] for name in PATTERNS]) / limits
    closest = np.array(PATTERNS, dtype=object)[np.nan_to_num(ratios, nan=-np.inf).argmax(0)]
    return np.where(np.isin(patterns.labels, PATTERNS), patterns.labels, closest)


@dataclass(frozen=True)
class SegmentTokens(TokenRoles):
    """What a view of one example segment shows: its tokens and their roles (:class:`TokenRoles`, as
    :class:`~bertology.attention.capturing.Attention` holds them); origin: where the segment comes from (file
    name and lines)."""

    origin: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "segment_ids": self.segment_ids.tolist(),
            "special": self.special.astype(int).tolist(),
            "word_ids": self.word_ids.tolist(),
            "words": self.words,
            "word_segments": self.word_segments.tolist(),
            "origin": self.origin,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SegmentTokens:
        return cls(
            tokens=[str(token) for token in data["tokens"]],
            segment_ids=np.asarray(data["segment_ids"], dtype=np.int64),
            special=np.asarray(data["special"], dtype=bool),
            word_ids=np.asarray(data["word_ids"], dtype=np.int64),
            words=[str(word) for word in data["words"]],
            word_segments=np.asarray(data["word_segments"], dtype=np.int64),
            origin=str(data["origin"]),
        )


@dataclass(frozen=True)
class Example:
    """One head's example: ``rank`` (0 = highest score), the segment's number, its score for the head's
    example pattern, its tokens and the head's ``codes`` [n, n] uint8 (``round(p * 255)``)."""

    rank: int
    segment: int
    score: float
    tokens: SegmentTokens
    codes: np.ndarray

    @property
    def probs(self) -> np.ndarray:
        """[n, n] float32: the codes as probabilities (each within 1/510 of the captured weight)."""
        return self.codes.astype(np.float32) / SCALE


@dataclass(frozen=True)
class HeadExamples:
    """Every head's top examples (module docstring).

    patterns: [layers, heads] object, each head's example pattern. segments / scores / offsets:
    [layers, heads, k]. attention: uint8 codes of every example end to end. texts: segment number ->
    its :class:`SegmentTokens`. model / weights: what was analysed.
    """

    model: str
    weights: str
    patterns: np.ndarray
    segments: np.ndarray
    scores: np.ndarray
    offsets: np.ndarray
    attention: np.ndarray
    texts: dict[int, SegmentTokens]

    @property
    def per_head(self) -> int:
        """k: the most examples a head has."""
        return int(self.segments.shape[-1])

    def head(self, layer: int, head: int) -> list[Example]:
        """The examples of ``(layer, head)``, highest score first (fewer than k where fewer segments
        defined its pattern)."""
        found = []
        for rank in range(self.per_head):
            segment, offset = int(self.segments[layer, head, rank]), int(self.offsets[layer, head, rank])
            if segment < 0 or offset < 0:
                continue
            tokens = self.texts[segment]
            n = len(tokens.tokens)
            codes = self.attention[offset : offset + n * n].reshape(n, n)
            found.append(Example(rank, segment, float(self.scores[layer, head, rank]), tokens, codes))
        return found

    def save(self, path: str | Path) -> Path:
        """Write the ``.npz`` file of the module docstring to ``path``."""
        meta = {
            "model": self.model,
            "weights": self.weights,
            "patterns": self.patterns.tolist(),
            "texts": {str(index): tokens.to_dict() for index, tokens in sorted(self.texts.items())},
        }
        np.savez_compressed(
            path,
            meta=np.array(json.dumps(meta, ensure_ascii=False)),
            segments=self.segments,
            scores=self.scores,
            offsets=self.offsets,
            attention=self.attention,
        )
        return Path(path)

    @classmethod
    def load(cls, source: str | Path | BinaryIO) -> HeadExamples:
        """Read a file written by :meth:`save`, by path or already opened (named by its ``name``).

        Raises:
            BertologyError: a file that is not one (named, with what is wrong).
        """
        try:
            with np.load(source, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                arrays = {name: data[name] for name in ("segments", "scores", "offsets", "attention")}
            examples = cls(
                model=str(meta["model"]),
                weights=str(meta["weights"]),
                patterns=np.array(meta["patterns"], dtype=object),
                segments=arrays["segments"].astype(np.int64),
                scores=arrays["scores"].astype(np.float64),
                offsets=arrays["offsets"].astype(np.int64),
                attention=arrays["attention"].astype(np.uint8),
                texts={int(index): SegmentTokens.from_dict(value) for index, value in meta["texts"].items()},
            )
        except (OSError, EOFError, zipfile.BadZipFile, ValueError, KeyError, TypeError) as error:
            raise BertologyError(f"{_name(source)} is not a readable examples file: {error}") from None
        examples._check(_name(source))
        return examples

    def _check(self, path: str) -> None:
        """Refuse a file whose parts do not fit together (cut, or edited by hand)."""
        shape = self.segments.shape
        fits = len(shape) == 3 and self.scores.shape == shape == self.offsets.shape
        fits = fits and self.patterns.shape == shape[:2] and set(self.patterns.ravel()) <= set(PATTERNS)
        if fits:
            for segment, offset in zip(self.segments.ravel(), self.offsets.ravel(), strict=True):
                tokens = self.texts.get(int(segment))
                end = len(self.attention) - (0 if tokens is None else len(tokens.tokens) ** 2)
                if segment >= 0 and (tokens is None or not 0 <= offset <= end):
                    fits = False
                    break
        if not fits:
            raise BertologyError(f"{path} is not a readable examples file: its arrays do not fit together.")


def _name(source: str | Path | BinaryIO) -> str:
    """How messages name a file given by path or opened."""
    return str(source) if isinstance(source, str | Path) else str(source.name)


def chosen_examples(patterns: HeadPatterns, per_head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each head's example pattern (:func:`example_patterns`, [layers, heads]) and the numbers and scores
    of its top ``per_head`` segments for it ([layers, heads, per_head] each; -1 and ``-inf`` past the
    segments that defined the pattern).

    Raises:
        BertologyError: ``per_head`` outside 1 to the number of segments the analysis kept per head.
    """
    chosen_patterns = example_patterns(patterns)
    kept = patterns.top_segments[PATTERNS[0]].shape[-1]
    if not 1 <= per_head <= kept:
        raise BertologyError(
            f"The analysis kept {kept} segments per head; ask for 1 to {kept} examples, not {per_head}."
        )
    pattern_index = np.vectorize(PATTERNS.index, otypes=[np.int64])(chosen_patterns)[None, :, :, None]

    def of_chosen(table: dict[str, np.ndarray]) -> np.ndarray:
        """[layers, heads, per_head]: each head's entries of its example pattern."""
        stacked = np.stack([table[name] for name in PATTERNS])  # [patterns, layers, heads, kept]
        return np.take_along_axis(stacked, pattern_index, axis=0)[0, ..., :per_head]

    return chosen_patterns, of_chosen(patterns.top_segments), of_chosen(patterns.top_scores)


def collect_examples(
    patterns: HeadPatterns,
    segments: Mapping[int, Segment],
    loaded: LoadedModel,
    *,
    per_head: int,
    max_length: int,
    weights: Weights = "attention",
) -> HeadExamples:
    """Capture the top ``per_head`` segments of every head's example pattern (:func:`chosen_examples`)
    and keep each head's attention on them as 8-bit codes.

    segments: segment number -> the :class:`~bertology.corpus.segments.Segment` (at least every chosen one,
    e.g. :func:`bertology.analysis.analyze.example_segments`). max_length: the analysis's token limit
    (segments are cut as they were), at most :data:`EXAMPLE_MAX_TOKENS`.

    Raises:
        BertologyError: ``per_head`` above what the analysis kept, a chosen segment missing, or
            ``max_length`` over :data:`EXAMPLE_MAX_TOKENS`.
    """
    if max_length > EXAMPLE_MAX_TOKENS:
        raise BertologyError(
            f"Examples are stored for segments of at most {EXAMPLE_MAX_TOKENS} tokens, not {max_length}."
        )
    chosen_patterns, chosen, scores = chosen_examples(patterns, per_head)
    layers, heads = chosen_patterns.shape
    wanted = sorted({int(index) for index in np.unique(chosen) if index >= 0})
    missing = [index for index in wanted if index not in segments]
    if missing:
        raise BertologyError(f"Segment {missing[0]} of the examples was not given.")
    offsets = np.full(chosen.shape, -1, dtype=np.int64)
    pieces: list[np.ndarray] = []
    texts: dict[int, SegmentTokens] = {}
    size = 0
    for batch in _example_batches([(index, segments[index]) for index in wanted], layers * heads, max_length):
        captured = capture_batch(
            [segment.text_a for _, segment in batch],
            [segment.text_b for _, segment in batch],
            model=loaded,
            max_length=max_length,
            weights=weights,
        )
        encoded = captured.encoded
        probs = captured.probs.float().cpu().numpy()  # [B, layers, heads, N, N]
        for row, (index, segment) in enumerate(batch):
            n = int(encoded.lengths[row])
            texts[index] = SegmentTokens(
                tokens=list(encoded.tokens[row]),
                segment_ids=np.asarray(encoded.segment_ids[row], dtype=np.int64),
                special=np.asarray(encoded.special[row], dtype=bool),
                word_ids=np.asarray(encoded.word_ids[row], dtype=np.int64),
                words=list(encoded.words[row]),
                word_segments=np.asarray(encoded.word_segments[row], dtype=np.int64),
                origin=segment.origin,
            )
            for layer, head, rank in zip(*np.nonzero(chosen == index), strict=True):
                codes = np.rint(np.clip(probs[row, layer, head, :n, :n], 0.0, 1.0) * SCALE).astype(np.uint8)
                offsets[layer, head, rank] = size
                pieces.append(codes.ravel())
                size += codes.size
    return HeadExamples(
        model=loaded.name,
        weights=weights,
        patterns=chosen_patterns,
        segments=chosen,
        scores=scores,
        offsets=offsets,
        attention=np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint8),
        texts=texts,
    )


def _example_batches(
    segments: list[tuple[int, Segment]], layers_heads: int, max_length: int
) -> list[list[tuple[int, Segment]]]:
    """``segments`` ordered longest first (by their token count, cut at ``max_length``) and cut into
    batches of at most :data:`BATCH_VALUES` attention values ``B x layers x heads x N x N``."""
    batches: list[list[tuple[int, Segment]]] = []
    width = 0
    for item in sorted(segments, key=lambda pair: -pair[1].tokens):
        if not batches or (len(batches[-1]) + 1) * layers_heads * width**2 > BATCH_VALUES:
            batches.append([])
            width = min(item[1].tokens, max_length) or max_length  # the longest of the new batch
        batches[-1].append(item)
    return batches
