"""Per-head surface statistics of attention over a corpus (Clark et al. 2019, Sec. 3; Voita et al. 2019).

Every statistic is a per-query quantity ``v(q)`` over a set of query tokens. For one segment (one
input, ``n`` real tokens, attention ``A = probs[b, layer, head, :n, :n]``) it is averaged over that
segment's queries; the corpus value is the plain mean of those segment averages over the segments
where the query set is not empty, as in Clark et al.'s analysis code. Each statistic below states
``v(q)`` and its queries. Roles ([CLS], [SEP], punctuation) come from
:class:`~bertology.stats.rows.TokenRoles`, so RoBERTa's ``<s>`` / ``</s>`` count as [CLS] / [SEP].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Self

from bertology.stats.base import HeadTable, SegmentMeans
from bertology.stats.rows import QueryValues, RowSummary, SpecialTokens, stack_segment_means

if TYPE_CHECKING:
    from bertology.capture import AttentionBatch

Statistic = Callable[[RowSummary], QueryValues]


def previous_token(rows: RowSummary) -> QueryValues:
    """Attention to the previous token (Clark et al. 2019, Fig. 2): ``v(q) = A[q, q-1]`` over
    queries ``q = 1 .. n-1``."""
    return QueryValues(rows.previous, rows.previous_queries)


def next_token(rows: RowSummary) -> QueryValues:
    """Attention to the next token (Clark et al. 2019, Fig. 2): ``v(q) = A[q, q+1]`` over queries
    ``q = 0 .. n-2``."""
    return QueryValues(rows.next, rows.next_queries)


def current_token(rows: RowSummary) -> QueryValues:
    """Attention to the token itself (Clark et al. 2019): ``v(q) = A[q, q]`` over all queries."""
    return QueryValues(rows.current, rows.roles.valid)


def to_cls(rows: RowSummary) -> QueryValues:
    """Attention to [CLS] (Clark et al. 2019, Fig. 2): ``v(q) = sum_{k in CLS} A[q, k]`` over all queries."""
    return QueryValues(rows.cls, rows.roles.valid)


def to_sep(rows: RowSummary) -> QueryValues:
    """Attention to [SEP] (Clark et al. 2019, Fig. 2): ``v(q) = sum_{k in SEP} A[q, k]`` over all queries."""
    return QueryValues(rows.sep, rows.roles.valid)


def to_punct(rows: RowSummary) -> QueryValues:
    """Attention to "." and "," (Clark et al. 2019, Fig. 2): ``v(q) = sum_{k in PUNCT} A[q, k]`` over
    all queries (PUNCT: non-special tokens whose text, without subword marker, is "." or ",")."""
    return QueryValues(rows.punct, rows.roles.valid)


def sep_to_sep(rows: RowSummary) -> QueryValues:
    """[SEP] attending to [SEP] (Clark et al. 2019, Fig. 3): ``v(q) = sum_{k in SEP} A[q, k]`` over
    the [SEP] queries."""
    return QueryValues(rows.sep, rows.roles.is_sep)


def other_to_sep(rows: RowSummary) -> QueryValues:
    """Other tokens attending to [SEP] (Clark et al. 2019, Fig. 3): ``v(q) = sum_{k in SEP} A[q, k]``
    over the queries that are not [SEP] ([CLS] included)."""
    return QueryValues(rows.sep, rows.roles.valid & ~rows.roles.is_sep)


def entropy(rows: RowSummary) -> QueryValues:
    """Attention entropy in nats (Clark et al. 2019, Sec. 3.3): ``v(q) = -sum_k A[q, k] ln A[q, k]``
    over all queries (``0 ln 0 = 0``)."""
    return QueryValues(rows.entropy, rows.roles.valid)


def entropy_uniform(rows: RowSummary) -> QueryValues:
    """Baseline for :func:`entropy`, the entropy of uniform attention: ``v(q) = ln n`` over all queries."""
    return QueryValues(rows.log_length, rows.roles.valid)


def cls_entropy(rows: RowSummary) -> QueryValues:
    """Entropy of [CLS]'s attention in nats (Clark et al. 2019, Fig. 4, bottom):
    ``v(q) = -sum_k A[q, k] ln A[q, k]`` over the [CLS] queries."""
    return QueryValues(rows.entropy, rows.roles.is_cls)


def cls_entropy_uniform(rows: RowSummary) -> QueryValues:
    """Baseline for :func:`cls_entropy`: ``v(q) = ln n`` over the [CLS] queries."""
    return QueryValues(rows.log_length, rows.roles.is_cls)


def confidence(rows: RowSummary) -> QueryValues:
    """Head confidence (Voita et al. 2019, Sec. 4.1): ``v(q) = max_k A[q, k]`` over all queries."""
    return QueryValues(rows.maximum, rows.roles.valid)


def content_confidence(rows: RowSummary) -> QueryValues:
    """Head confidence with [CLS] and [SEP] left out, as Voita et al. 2019 leave out the end-of-sentence
    token: ``v(q) = max_{k not in CLS or SEP} A[q, k]`` over all queries. The weights are not
    renormalised, so a head that attends only to [SEP] has confidence near 0 here."""
    return QueryValues(rows.content_maximum, rows.roles.valid)


#: The surface statistics in the order of :class:`SurfaceAccumulator`'s table columns.
SURFACE_STATISTICS: dict[str, Statistic] = {
    "previous": previous_token,
    "next": next_token,
    "current": current_token,
    "cls": to_cls,
    "sep": to_sep,
    "punct": to_punct,
    "sep_to_sep": sep_to_sep,
    "other_to_sep": other_to_sep,
    "entropy": entropy,
    "entropy_uniform": entropy_uniform,
    "cls_entropy": cls_entropy,
    "cls_entropy_uniform": cls_entropy_uniform,
    "confidence": confidence,
    "content_confidence": content_confidence,
}


class SurfaceAccumulator:
    """Streams :data:`SURFACE_STATISTICS` over a corpus; ``result()`` is a
    :class:`~bertology.stats.base.HeadTable` with one ``[layers, heads]`` column per statistic.

    special: the model's [CLS] / [SEP] strings (``SpecialTokens.of(model)``; default BERT's).
    """

    def __init__(self, special: SpecialTokens | None = None) -> None:
        self.special = special or SpecialTokens()
        self.means = SegmentMeans(SURFACE_STATISTICS)

    def update(self, batch: AttentionBatch) -> None:
        self.update_rows(RowSummary.of(batch, self.special))

    def update_rows(self, rows: RowSummary) -> None:
        """Fold in a batch already summarised (e.g. once for several accumulators, or while streaming)."""
        self.means.add(*stack_segment_means(statistic(rows) for statistic in SURFACE_STATISTICS.values()))

    def merge(self, other: Self) -> Self:
        self.means.merge(other.means)
        return self

    def result(self) -> HeadTable:
        return self.means.table("surface statistics accumulator")
