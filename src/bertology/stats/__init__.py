"""Streaming corpus statistics over attention batches: ``update(batch)`` / ``merge(other)`` / ``result()``.

May import the captured attention (:mod:`bertology.attention`) and what lies below it; the analyses,
probes and corpus runs build on it.
"""

from bertology.accumulator import Accumulator
from bertology.stats.base import HeadTable, SegmentCounter, SegmentMeans
from bertology.stats.rows import QueryValues, RowSummarizer, RowSummary, SpecialTokens, TokenRoles
from bertology.stats.surface import (
    CONVENTIONS,
    SURFACE_STATISTICS,
    Convention,
    SurfaceAccumulator,
    statistics_of,
)

__all__ = [
    "CONVENTIONS",
    "SURFACE_STATISTICS",
    "Accumulator",
    "Convention",
    "HeadTable",
    "QueryValues",
    "RowSummarizer",
    "RowSummary",
    "SegmentCounter",
    "SegmentMeans",
    "SpecialTokens",
    "SurfaceAccumulator",
    "TokenRoles",
    "statistics_of",
]
