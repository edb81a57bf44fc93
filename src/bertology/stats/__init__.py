"""Streaming corpus statistics over attention batches: ``update(batch)`` / ``merge(other)`` / ``result()``."""

from bertology.stats.base import Accumulator, HeadTable, SegmentCounter, SegmentMeans
from bertology.stats.rows import QueryValues, RowSummarizer, RowSummary, SpecialTokens, TokenRoles
from bertology.stats.surface import SURFACE_STATISTICS, SurfaceAccumulator

__all__ = [
    "SURFACE_STATISTICS",
    "Accumulator",
    "HeadTable",
    "QueryValues",
    "RowSummarizer",
    "RowSummary",
    "SegmentCounter",
    "SegmentMeans",
    "SpecialTokens",
    "SurfaceAccumulator",
    "TokenRoles",
]
