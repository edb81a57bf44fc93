"""Corpus analyses built on the streaming statistics: head pattern labels, head distances and MDS; and
the heads' composition scores from the weights alone."""

from bertology.analysis.composition import CompositionScores, composition_scores
from bertology.analysis.distances import DistanceAccumulator, HeadDistances, js_divergence_sums, mds_embedding
from bertology.analysis.patterns import (
    FOCUSED_PATTERNS,
    PATTERN_DESCRIPTIONS,
    PATTERNS,
    HeadPatterns,
    PatternAccumulator,
    PatternThresholds,
    label_heads,
)

__all__ = [
    "FOCUSED_PATTERNS",
    "PATTERNS",
    "PATTERN_DESCRIPTIONS",
    "CompositionScores",
    "DistanceAccumulator",
    "HeadDistances",
    "HeadPatterns",
    "PatternAccumulator",
    "PatternThresholds",
    "composition_scores",
    "js_divergence_sums",
    "label_heads",
    "mds_embedding",
]
