"""Per-head attention patterns over a corpus and one primary label per head.

Pattern scores follow the surface statistics of Clark et al. 2019 (Sec. 3) and the head roles of
Voita et al. 2019 and Kovaleva et al. 2019 (vertical / diagonal / broad). Each score is a per-query
quantity averaged over a segment's queries, then over the segments where it is defined (see
:mod:`bertology.stats.surface`). Token text is compared lowercased and without subword markers
(:func:`~bertology.stats.rows.surface_form`); special tokens never count as words.

While streaming, the accumulator also remembers, per pattern and head, the ``keep`` segments where the
score was highest (a bounded top-k per head), so a report can show each head's label on its clearest
examples (:mod:`bertology.analysis.examples`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import torch
from torch.nn.functional import pad

from bertology.errors import BertologyError
from bertology.stats.base import HeadTable, SegmentCounter, SegmentMeans, check_same_shape, on_the_host
from bertology.stats.rows import QueryValues, RowSummary, SpecialTokens, stack_segment_means
from bertology.stats.surface import next_token, previous_token

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import pandas as pd

    from bertology.attention.capturing import AttentionBatch

#: Labels of heads that focus on particular keys, most specific first (this order breaks ties).
FOCUSED_PATTERNS = ("word_pieces", "other_sentence", "same_word", "next", "previous", "delimiters")

#: Every pattern score, in table order.
PATTERNS = (*FOCUSED_PATTERNS, "broad")

#: What each label means, for reports.
PATTERN_DESCRIPTIONS = {
    "next": "next word",
    "previous": "previous word",
    "same_word": "same or related word (itself included)",
    "other_sentence": "same word in the other sentence",
    "word_pieces": "other word pieces of the same word",
    "delimiters": "delimiters ([CLS] / [SEP])",
    "broad": "broad: near-uniform within its sentence",
    "none": "none of these",
}

#: The labels a decoder's head can take besides the patterns, from its scores on repeated random tokens
#: and its attention sink (:mod:`bertology.analysis.head_detectors`), in precedence order; see
#: :func:`decoder_labels`.
DECODER_LABELS = ("induction", "duplicate_token", "previous_token", "sink")

#: What each decoder label means, for reports.
DECODER_LABEL_DESCRIPTIONS = {
    "induction": "induction: the token after an earlier occurrence of its own (repeated random tokens)",
    "duplicate_token": "duplicate token: earlier occurrences of its own token (repeated random tokens)",
    "previous_token": "previous token (repeated random tokens)",
    "sink": "attention sink: the segment's first token",
}

#: Every label a head can have, patterns and decoder labels, ``"none"`` last.
LABEL_DESCRIPTIONS = {
    **{name: text for name, text in PATTERN_DESCRIPTIONS.items() if name != "none"},
    **DECODER_LABEL_DESCRIPTIONS,
    "none": PATTERN_DESCRIPTIONS["none"],
}

#: The labels' colours in every figure, report and web page (one palette, here): matplotlib's tab10 in
#: :data:`PATTERN_DESCRIPTIONS` order without its grey, which is kept for ``"none"``; the decoder labels
#: take tab20's light shade of the closest pattern's colour (previous token: previous's; duplicate token:
#: same word's; sink: delimiters', the encoders' resting place) and induction tab10's cyan.
PATTERN_COLOURS = {
    "next": "#1f77b4",
    "previous": "#ff7f0e",
    "same_word": "#2ca02c",
    "other_sentence": "#d62728",
    "word_pieces": "#9467bd",
    "delimiters": "#8c564b",
    "broad": "#e377c2",
    "induction": "#17becf",
    "duplicate_token": "#98df8a",
    "previous_token": "#ffbb78",
    "sink": "#c49c94",
    "none": "#7f7f7f",
}
#: The colour of a label not in :data:`PATTERN_COLOURS` (tab10's next colour).
OTHER_PATTERN_COLOUR = "#bcbd22"


@dataclass(frozen=True)
class PatternThresholds:
    """The lowest score at which each pattern can be a head's label.

    For the focused patterns the score is a mean attention mass in [0, 1]; for ``broad`` it is the
    mean ratio of a row's entropy to the entropy of uniform attention over the query's sentence, which
    exceeds 1 where rows spread beyond the sentence (:func:`broad`).
    """

    next: float = 0.5
    previous: float = 0.5
    same_word: float = 0.5
    other_sentence: float = 0.5
    word_pieces: float = 0.5
    delimiters: float = 0.5
    broad: float = 0.9


@dataclass(frozen=True)
class DetectorThresholds:
    """The lowest score (attention mass in [0, 1]) at which a decoder's head is labelled with each kind
    (:data:`DECODER_LABELS`; ``bertology heads`` and the labels of a decoder's analysis)."""

    previous_token: float = 0.5
    duplicate_token: float = 0.4
    induction: float = 0.4
    sink: float = 0.5


def same_word(rows: RowSummary) -> QueryValues:
    """Same or related word: ``v(q) = sum_k A[q, k]`` over keys ``k`` (``q`` itself included) with the
    same token text as ``q`` or the same word as ``q``; queries: every non-special token."""
    return QueryValues(rows.same_word, rows.same_word_queries)


def other_sentence(rows: RowSummary) -> QueryValues:
    """Same word in the other sentence: ``v(q) = sum_k A[q, k]`` over keys ``k`` with the same token text
    as ``q`` in the other sentence of a pair; queries: the tokens that have such a key."""
    return QueryValues(rows.other_sentence, rows.other_sentence_queries)


def word_pieces(rows: RowSummary) -> QueryValues:
    """Other pieces of the same word: ``v(q) = sum_{k != q} A[q, k]`` over keys of ``q``'s word;
    queries: tokens of words split into two or more pieces."""
    return QueryValues(rows.word_pieces, rows.word_piece_queries)


def delimiters(rows: RowSummary) -> QueryValues:
    """Delimiters: ``v(q) = sum_{k in CLS or SEP} A[q, k]`` over all queries (of segments with a [CLS]
    or [SEP]: a decoder's have none)."""
    return QueryValues(rows.cls + rows.sep, rows.roles.valid & rows.roles.is_delimiter.any(-1, keepdim=True))


def broad(rows: RowSummary) -> QueryValues:
    """Broad attention: ``v(q) = H(A[q]) / ln m(q)``, the row's entropy in nats over that of uniform
    attention across ``q``'s sentence (``m(q)`` tokens with ``q``'s segment id, its [CLS] / [SEP]
    included; for causal attention only those up to ``q``); queries: those with ``m(q) >= 2``. For a
    single text the sentence is the whole segment.

    The score is not bounded by 1, and is not rescaled to be: its yardstick is uniform attention over the
    query's *own sentence*, which is what "broad" means here, while a row may spread over every key the
    query can see. In a pair, a query of text A can attend to text B too, so a row uniform over all ``n``
    keys scores ``ln n / ln m(q)`` (1.30 for a query of a 10-token sentence in a 20-token pair), and a head
    whose rows spread across both sentences averages above 1. Where a query sees only its own
    sentence (a single text, a decoder) a row scores at most 1. The threshold 0.9 asks for rows at least
    nine tenths as spread as uniform over the sentence; a score above 1 says the head also looks beyond it."""
    sizes = rows.roles.attendable_counts(same_segment=True)
    queries = rows.roles.valid & (sizes >= 2)
    log_size = torch.log(sizes.clamp_min(2).to(rows.entropy.dtype))[:, None, None, :]
    return QueryValues(rows.entropy / log_size, queries)


#: Every pattern's per-query score, keyed and ordered as :data:`PATTERNS`.
PATTERN_SCORES: dict[str, Callable[[RowSummary], QueryValues]] = {
    "word_pieces": word_pieces,
    "other_sentence": other_sentence,
    "same_word": same_word,
    "next": next_token,
    "previous": previous_token,
    "delimiters": delimiters,
    "broad": broad,
}


def label_heads(scores: Mapping[str, np.ndarray], thresholds: PatternThresholds) -> np.ndarray:
    """The primary label of each head, ``[layers, heads]`` object array of pattern names.

    Among the focused patterns whose score reaches its threshold, the one with the highest score
    (ties: the more specific, see :data:`FOCUSED_PATTERNS`); if none reaches its threshold,
    ``"broad"`` when the broad score reaches its threshold, else ``"none"``. NaN scores never qualify.
    """
    stacked = np.stack([scores[name] for name in FOCUSED_PATTERNS])
    limits = np.array([getattr(thresholds, name) for name in FOCUSED_PATTERNS])[:, None, None]
    qualified = np.where(stacked >= limits, stacked, -np.inf)
    labels = np.array(FOCUSED_PATTERNS, dtype=object)[qualified.argmax(0)]
    fallback = np.where(scores["broad"] >= thresholds.broad, "broad", "none").astype(object)
    return np.where(np.isfinite(qualified.max(0)), labels, fallback)


def decoder_labels(
    labels: np.ndarray, scores: Mapping[str, np.ndarray], thresholds: DetectorThresholds
) -> np.ndarray:
    """The primary label of each head of a decoder, ``[layers, heads]`` object array: the first of these
    rules that holds (NaN scores never qualify):

    1. ``induction``, 2. ``duplicate_token``, 3. ``previous_token``: its score on repeated random tokens
       reaches its threshold (:class:`DetectorThresholds`), in this order, the most specific first (an
       induction head of a repeated sequence also attends near the token's earlier occurrence). These come
       first because their inputs are built to tell these kinds apart, which natural text does not;
    4. a focused pattern's label (:func:`label_heads`, on the corpus: ``previous``, ``next``, ...);
    5. ``sink``: its mean mass on the segment's first token reaches its threshold. It comes after the
       patterns because most of a decoder's heads rest much of their attention there, as an encoder's
       rest on [CLS] and [SEP] (Clark et al. 2019), so a head that also does something specific is named
       by that;
    6. ``broad``, else ``"none"`` (:func:`label_heads`).

    labels: :func:`label_heads`'s labels; scores: ``[layers, heads]`` per name of :data:`DECODER_LABELS`.
    """
    limits = asdict(thresholds)
    rules: list[tuple[np.ndarray, object]] = [
        (scores[name] >= limits[name], name) for name in DECODER_LABELS[:3]
    ]  # NaN >= t: False
    rules += [(np.isin(labels, FOCUSED_PATTERNS), labels), (scores["sink"] >= limits["sink"], "sink")]
    chosen = labels.astype(object)  # rule 6: broad or none
    for holds, label in reversed(rules):  # the first rule that holds is applied last
        chosen = np.where(holds, label, chosen)
    return chosen.astype(object)


@dataclass
class HeadPatterns:
    """Pattern scores and primary labels of every head.

    scores: a :class:`HeadTable` with one ``[layers, heads]`` column per pattern in :data:`PATTERNS`.
    labels: [layers, heads] object array, a pattern name or ``"none"`` (:func:`label_heads`).
    top_segments: pattern -> [layers, heads, keep] int64 indices of the segments where the head's score
        for that pattern was highest, highest first (the earlier segment first on ties), -1 past the
        segments that defined it.
    top_scores: pattern -> [layers, heads, keep] those segments' scores (``-inf`` past them).
    thresholds: the thresholds the labels were chosen with.
    """

    scores: HeadTable
    labels: np.ndarray
    top_segments: dict[str, np.ndarray]
    top_scores: dict[str, np.ndarray]
    thresholds: PatternThresholds

    @property
    def best_segment(self) -> dict[str, np.ndarray]:
        """pattern -> [layers, heads] int64: the segment where the head's score was highest, -1 for none."""
        return {name: segments[..., 0] for name, segments in self.top_segments.items()}

    @property
    def best_score(self) -> dict[str, np.ndarray]:
        """pattern -> [layers, heads]: that segment's score (``-inf`` where none)."""
        return {name: scores[..., 0] for name, scores in self.top_scores.items()}

    @property
    def label_segment(self) -> np.ndarray:
        """[layers, heads] int64: the best segment of each head's label pattern, -1 for ``"none"``."""
        chosen = np.full(self.labels.shape, -1, dtype=np.int64)
        for name, segments in self.best_segment.items():
            chosen = np.where(self.labels == name, segments, chosen)
        return chosen

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based), ``label``, ``label_segment``, then the scores."""
        frame = self.scores.to_frame()
        frame.insert(2, "label", self.labels.reshape(-1))
        frame.insert(3, "label_segment", self.label_segment.reshape(-1))
        return frame

    def to_json(self) -> str:
        """JSON text: thresholds, labels and label segments as ``[layers][heads]`` lists, and the scores."""
        data: dict[str, Any] = {
            "thresholds": asdict(self.thresholds),
            "labels": self.labels.tolist(),
            "label_segment": self.label_segment.tolist(),
            "scores": self.scores.to_dict(),
        }
        return json.dumps(data, allow_nan=False)


class PatternAccumulator:
    """Streams the pattern scores of every head and keeps each pattern's best segments per head.

    special: the model's [CLS] / [SEP] strings (``SpecialTokens.of(model)``; default BERT's).
    first_segment: index of the first segment this accumulator will see; segments are numbered in the
        order they arrive. Give each shard of a corpus its own first index so merged shards report the
        same best segments as one pass.
    thresholds: for the labels in :meth:`result`.
    keep: how many best segments to keep per pattern and head (at least 1), highest score first.
    """

    def __init__(
        self,
        special: SpecialTokens | None = None,
        *,
        first_segment: int = 0,
        thresholds: PatternThresholds | None = None,
        keep: int = 1,
    ) -> None:
        if keep < 1:
            raise BertologyError(f"Keep at least 1 best segment per head, not {keep}.")
        self.special = special or SpecialTokens()
        self.thresholds = thresholds or PatternThresholds()
        self.keep = keep
        self.means = SegmentMeans(PATTERNS)
        self.counter = SegmentCounter(first_segment)
        # [patterns, layers, heads, keep] float64 (highest first) and int64, where the scores are computed
        self._top_score: torch.Tensor | None = None
        self._top_segment: torch.Tensor | None = None

    @property
    def top_score(self) -> np.ndarray | None:
        """[patterns, layers, heads, keep] float64: each pattern's highest segment scores per head so far."""
        return None if self._top_score is None else self._top_score.cpu().numpy()

    @property
    def top_segment(self) -> np.ndarray | None:
        """[patterns, layers, heads, keep] int64: the segments of :attr:`top_score` (-1 past them)."""
        return None if self._top_segment is None else self._top_segment.cpu().numpy()

    @property
    def best_score(self) -> np.ndarray | None:
        """[patterns, layers, heads] float64: each pattern's highest segment score per head so far."""
        return None if self._top_score is None else self._top_score[..., 0].cpu().numpy()

    @property
    def items(self) -> int:
        """Segments seen."""
        return self.means.segments

    def update(self, batch: AttentionBatch) -> None:
        self.update_rows(RowSummary.of(batch, self.special))

    def update_rows(self, rows: RowSummary) -> None:
        """Fold in a batch already summarised (e.g. once for several accumulators, or while streaming)."""
        values, defined = stack_segment_means(score(rows) for score in PATTERN_SCORES.values())
        self.means.add(values, defined)
        scores = torch.where(defined[:, :, None, None], values, -torch.inf)  # [B, P, L, H]
        segments = torch.as_tensor(self.counter.take(values.shape[0]), device=scores.device)
        self._keep_best(scores.movedim(0, -1), segments.expand((*scores.shape[1:], -1)))

    def _keep_best(self, score: torch.Tensor, segment: torch.Tensor) -> None:
        """Keep, per pattern and head, the :attr:`keep` highest of the kept and the new ``score``
        ``[patterns, layers, heads, M]`` float64 (the lower segment index first on ties; ``segment`` the
        same shape, int64); -1 for undefined ones. Sorted where the kept scores are: nothing reaches the
        host."""
        if self._top_score is not None and self._top_segment is not None:
            check_same_shape(
                tuple(self._top_score.shape[1:3]), tuple(score.shape[1:3]), "This pattern accumulator"
            )
            score = torch.cat([self._top_score, score.to(self._top_score.device)], dim=-1)
            segment = torch.cat([self._top_segment, segment.to(self._top_segment.device)], dim=-1)
        by_segment = segment.argsort(dim=-1, stable=True)  # ties in score keep the lower segment first
        score, segment = score.gather(-1, by_segment), segment.gather(-1, by_segment)
        order = (-score).argsort(dim=-1, stable=True)[..., : self.keep]
        score = score.gather(-1, order)
        segment = torch.where(score.isfinite(), segment.gather(-1, order), -1)
        if score.shape[-1] < self.keep:  # fewer segments so far than kept places
            missing = (0, self.keep - score.shape[-1])
            score = pad(score, missing, value=-torch.inf)
            segment = pad(segment, missing, value=-1)
        self._top_score, self._top_segment = score, segment

    def merge(self, other: Self) -> Self:
        self.means.merge(other.means)
        self.counter.merge(other.counter)
        if other._top_score is not None and other._top_segment is not None:
            self._keep_best(other._top_score, other._top_segment)
        return self

    def __getstate__(self) -> dict[str, Any]:
        return on_the_host(self.__dict__)

    def result(self) -> HeadPatterns:
        scores = self.means.table("pattern accumulator")
        assert self.top_score is not None and self.top_segment is not None
        return HeadPatterns(
            scores=scores,
            labels=label_heads(scores.columns, self.thresholds),
            top_segments=dict(zip(PATTERNS, self.top_segment, strict=True)),
            top_scores=dict(zip(PATTERNS, self.top_score, strict=True)),
            thresholds=self.thresholds,
        )
