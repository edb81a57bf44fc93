"""Streaming corpus statistics over attention batches: ``update(batch)`` / ``merge(other)`` / ``result()``."""

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
