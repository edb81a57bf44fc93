"""Per-head surface statistics of attention over a corpus (Clark et al. 2019, Sec. 3; Voita et al. 2019).

Every statistic is a per-query quantity ``v(q)`` over a set of query tokens. For one segment (one
input, ``n`` real tokens, attention ``A = probs[b, layer, head, :n, :n]``) it is averaged over that
segment's queries; the corpus value is the plain mean of those segment averages over the segments
where the query set is not empty. Each statistic below states ``v(q)`` and its queries. Roles ([CLS],
[SEP], punctuation) come from :class:`~bertology.stats.rows.TokenRoles`, so RoBERTa's ``<s>`` /
``</s>`` count as [CLS] / [SEP].

Two conventions (:data:`CONVENTIONS`) give the same columns. ``"bertology"`` (the default) averages
each statistic over the queries it is defined for, as stated below. ``"clark"`` reproduces the numbers
of Clark et al.'s released analysis code (github.com/clarkkev/attention-analysis,
``General_Analysis.ipynb``), which differ in four places: attention to the previous and next token is
averaged over all ``n`` queries (the query without such a neighbour counts 0), where bertology averages
over the ``n - 1`` that have one; [SEP]-to-[SEP] is divided by 2 and other-to-[SEP] by ``n - 2`` (the
number of such queries in their ``[CLS] A [SEP] B [SEP]`` segments); and the entropies are those of the
smoothed rows ``0.9999 A + 0.0001 / n``. The other statistics are the same in both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Self

import torch

from bertology.errors import BertologyError
from bertology.options import Convention
from bertology.stats.base import HeadTable, SegmentMeans
from bertology.stats.rows import QueryValues, RowSummary, SpecialTokens, stack_segment_means

if TYPE_CHECKING:
    from bertology.attention.capturing import AttentionBatch

Statistic = Callable[[RowSummary], QueryValues]

CONVENTIONS: tuple[Convention, ...] = ("bertology", "clark")

#: Clark et al.'s entropy smoothing: rows become ``(1 - ε) A + ε / n`` before the entropy is taken.
CLARK_SMOOTHING = 1e-4


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


def sink(rows: RowSummary) -> QueryValues:
    """Attention sink of a decoder (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
    Sinks"): the mass on the segment's first token, ``v(q) = A[q, 0]`` over queries ``q = 1 .. n-1`` (the
    first token itself has nowhere else to look). Defined for causal attention only; an encoder's first
    token is its [CLS] (see ``cls``)."""
    causal = torch.full_like(rows.roles.valid, rows.roles.causal)
    return QueryValues(rows.first, rows.previous_queries & causal)


def _with_any(rows: RowSummary, role: torch.Tensor) -> torch.Tensor:
    """[B, Q] bool: the real queries of segments that have a token of ``role`` ([B, N] bool) at all; a
    decoder's segments have no [CLS] or [SEP], so statistics about them stay undefined there (NaN)."""
    return rows.roles.valid & role.any(-1, keepdim=True)


def to_cls(rows: RowSummary) -> QueryValues:
    """Attention to [CLS] (Clark et al. 2019, Fig. 2): ``v(q) = sum_{k in CLS} A[q, k]`` over all queries
    (of segments with a [CLS])."""
    return QueryValues(rows.cls, _with_any(rows, rows.roles.is_cls))


def to_sep(rows: RowSummary) -> QueryValues:
    """Attention to [SEP] (Clark et al. 2019, Fig. 2): ``v(q) = sum_{k in SEP} A[q, k]`` over all queries
    (of segments with a [SEP])."""
    return QueryValues(rows.sep, _with_any(rows, rows.roles.is_sep))


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
    over the queries that are not [SEP] ([CLS] included; segments with a [SEP])."""
    return QueryValues(rows.sep, _with_any(rows, rows.roles.is_sep) & ~rows.roles.is_sep)


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
    """Largest attention weight: ``v(q) = max_k A[q, k]`` over all queries, every key included (unlike
    Voita et al.'s confidence, :func:`voita_confidence`, which leaves out the end-of-sentence token)."""
    return QueryValues(rows.maximum, rows.roles.valid)


def voita_confidence(rows: RowSummary) -> QueryValues:
    """Head confidence as Voita et al. 2019 (Sec. 4.1) define it, the largest weight with the
    end-of-sentence token left out, which is [SEP] here: ``v(q) = max_{k not in SEP} A[q, k]`` over all
    queries. [CLS] counts like any token. The weights are not renormalised."""
    return QueryValues(rows.non_sep_maximum, rows.roles.valid)


def confidence_without_delimiters(rows: RowSummary) -> QueryValues:
    """Largest weight on a token that is neither [CLS] nor [SEP] (bertology's own variant of
    :func:`voita_confidence`, which keeps [CLS]): ``v(q) = max_{k not in CLS or SEP} A[q, k]`` over all
    queries. The weights are not renormalised, so a head that attends only to [CLS] or [SEP] scores
    near 0 here."""
    return QueryValues(rows.non_delimiter_maximum, rows.roles.valid)


def _real_tokens(rows: RowSummary) -> torch.Tensor:
    """[B] float: each segment's ``n``."""
    return rows.roles.valid.sum(-1).to(rows.entropy.dtype)


def _smoothed_entropy(rows: RowSummary) -> torch.Tensor:
    if rows.smoothed_entropy is None:
        raise BertologyError(
            "Clark et al.'s entropy needs rows summarised with smoothing; build the RowSummary with "
            f"smoothing={CLARK_SMOOTHING}."
        )
    return rows.smoothed_entropy


def clark_previous_token(rows: RowSummary) -> QueryValues:
    """Attention to the previous token as Clark et al.'s released code computes it: ``v(q) = A[q, q-1]``
    averaged over all ``n`` queries, the first one (no previous token) counting 0."""
    return QueryValues(
        torch.where(rows.previous_queries[:, None, None, :], rows.previous, 0.0), rows.roles.valid
    )


def clark_next_token(rows: RowSummary) -> QueryValues:
    """Attention to the next token as Clark et al.'s released code computes it: ``v(q) = A[q, q+1]``
    averaged over all ``n`` queries, the last one (no next token) counting 0."""
    return QueryValues(torch.where(rows.next_queries[:, None, None, :], rows.next, 0.0), rows.roles.valid)


def clark_sep_to_sep(rows: RowSummary) -> QueryValues:
    """[SEP] attending to [SEP] as Clark et al.'s released code computes it: ``v(q) = sum_{k in SEP}
    A[q, k]`` summed over the [SEP] queries and divided by 2 (the [SEP] count of a pair segment)."""
    return QueryValues(rows.sep, rows.roles.is_sep, torch.full_like(_real_tokens(rows), 2.0))


def clark_other_to_sep(rows: RowSummary) -> QueryValues:
    """Other tokens attending to [SEP] as Clark et al.'s released code computes it: ``v(q) = sum_{k in
    SEP} A[q, k]`` summed over the queries that are not [SEP] and divided by ``n - 2``."""
    return QueryValues(
        rows.sep, _with_any(rows, rows.roles.is_sep) & ~rows.roles.is_sep, _real_tokens(rows) - 2.0
    )


def clark_entropy(rows: RowSummary) -> QueryValues:
    """Attention entropy in nats as Clark et al.'s released code computes it: ``v(q) = -sum_k s_k ln s_k``
    of the smoothed row ``s = 0.9999 A[q] + 0.0001 / n``, over all queries."""
    return QueryValues(_smoothed_entropy(rows), rows.roles.valid)


def clark_cls_entropy(rows: RowSummary) -> QueryValues:
    """Entropy of [CLS]'s attention in nats as Clark et al.'s released code computes it: the smoothed
    row's entropy (see :func:`clark_entropy`) over the [CLS] queries."""
    return QueryValues(_smoothed_entropy(rows), rows.roles.is_cls)


#: The surface statistics in the order of :class:`SurfaceAccumulator`'s table columns.
SURFACE_STATISTICS: dict[str, Statistic] = {
    "previous": previous_token,
    "next": next_token,
    "current": current_token,
    "cls": to_cls,
    "sep": to_sep,
    "punct": to_punct,
    "sink": sink,
    "sep_to_sep": sep_to_sep,
    "other_to_sep": other_to_sep,
    "entropy": entropy,
    "entropy_uniform": entropy_uniform,
    "cls_entropy": cls_entropy,
    "cls_entropy_uniform": cls_entropy_uniform,
    "confidence": confidence,
    "voita_confidence": voita_confidence,
    "confidence_without_delimiters": confidence_without_delimiters,
}

#: One line on each surface statistic, for pickers and legends (the functions above give the formulas).
#: The statistics defined for causal attention only (a decoder's): an encoder's are undefined everywhere.
CAUSAL_ONLY = ("sink",)

SURFACE_DESCRIPTIONS = {
    "previous": "attention to the previous token",
    "next": "attention to the next token",
    "current": "attention to the token itself",
    "cls": "attention to [CLS]",
    "sep": "attention to [SEP]",
    "punct": 'attention to "." and ","',
    "sink": "attention to a decoder's first token (attention sink)",
    "sep_to_sep": "attention of [SEP] to [SEP]",
    "other_to_sep": "attention of the other tokens to [SEP]",
    "entropy": "entropy of a token's attention, nats (low: focused, high: broad)",
    "entropy_uniform": "entropy of uniform attention, nats (the baseline of entropy)",
    "cls_entropy": "entropy of [CLS]'s attention, nats",
    "cls_entropy_uniform": "entropy of uniform attention from [CLS], nats (the baseline of cls_entropy)",
    "confidence": "largest attention weight of a token (every key counted)",
    "voita_confidence": "largest weight with [SEP] left out (Voita et al. 2019's head confidence)",
    "confidence_without_delimiters": "largest weight with [CLS] and [SEP] left out",
}

#: The statistics of the ``"clark"`` convention: the same columns, six computed as Clark et al.'s code does.
CLARK_SURFACE_STATISTICS: dict[str, Statistic] = {
    **SURFACE_STATISTICS,
    "previous": clark_previous_token,
    "next": clark_next_token,
    "sep_to_sep": clark_sep_to_sep,
    "other_to_sep": clark_other_to_sep,
    "entropy": clark_entropy,
    "cls_entropy": clark_cls_entropy,
}


def statistics_of(convention: Convention) -> Mapping[str, Statistic]:
    """The statistic functions of ``convention`` (see the module docstring), in table order.

    Raises:
        BertologyError: an unknown convention.
    """
    if convention not in CONVENTIONS:
        raise BertologyError(f"Unknown convention '{convention}'; use one of: {', '.join(CONVENTIONS)}.")
    return CLARK_SURFACE_STATISTICS if convention == "clark" else SURFACE_STATISTICS


class SurfaceAccumulator:
    """Streams the surface statistics (:data:`SURFACE_STATISTICS`'s columns) over a corpus; ``result()``
    is a :class:`~bertology.stats.base.HeadTable` with one ``[layers, heads]`` column per statistic.

    special: the model's [CLS] / [SEP] strings (``SpecialTokens.of(model)``; default BERT's).
    convention: ``"bertology"`` or ``"clark"`` (see the module docstring). The ``"clark"`` convention
        needs rows summarised with :attr:`smoothing` (``RowSummarizer(..., smoothing=...)``).

    Raises:
        BertologyError: an unknown convention.
    """

    def __init__(self, special: SpecialTokens | None = None, *, convention: Convention = "bertology") -> None:
        self.special = special or SpecialTokens()
        self.statistics = statistics_of(convention)
        self.convention = convention
        self.means = SegmentMeans(self.statistics)

    @property
    def smoothing(self) -> float:
        """The entropy smoothing ε the rows must be summarised with (0: none needed)."""
        return CLARK_SMOOTHING if self.convention == "clark" else 0.0

    @property
    def items(self) -> int:
        """Segments seen."""
        return self.means.segments

    def update(self, batch: AttentionBatch) -> None:
        self.update_rows(RowSummary.of(batch, self.special, smoothing=self.smoothing))

    def update_rows(self, rows: RowSummary) -> None:
        """Fold in a batch already summarised (e.g. once for several accumulators, or while streaming)."""
        self.means.add(*stack_segment_means(statistic(rows) for statistic in self.statistics.values()))

    def merge(self, other: Self) -> Self:
        if other.convention != self.convention:
            raise BertologyError(
                f"Cannot merge statistics of the '{other.convention}' convention into '{self.convention}'."
            )
        self.means.merge(other.means)
        return self

    def result(self) -> HeadTable:
        return self.means.table("surface statistics accumulator")
